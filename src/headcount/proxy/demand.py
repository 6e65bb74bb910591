"""Flow control's side of admission: whose a request is, what it may cost, how it hears no.

With a tenants file, every proxied request is a `Demand` on flow control: its
tenant (from its key), its priority (the tenant's, lowered by an
`x-gateway-inference-objective` the file names), its flow inside the tenant
(`x-gateway-inference-fairness-id`), and the tokens it reserves: its prompt's
(counted by the router's tokenizer when it has one, else its body's bytes / 4)
plus the most it may generate (`max_completion_tokens` or `max_tokens`, else
`DEFAULT_COMPLETION_RESERVE`). A streamed request that does not ask for usage
is forwarded asking for it (`usage.ask_usage`), so that its tokens can be
settled; the usage chunk is then taken out of what the client receives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from headcount._http.handler import Request
from headcount._http.wire import JSON_HEADER, error_body
from headcount.auth import Credentials
from headcount.auth.tenants import Tenant, effective_priority
from headcount.flow.control import FlowControl
from headcount.flow.ticket import Ask, Refusal
from headcount.proxy.errors import ErrorAnswer
from headcount.proxy.headers import find_header
from headcount.proxy.usage import ask_usage

__all__ = ["DEFAULT_COMPLETION_RESERVE", "Demand", "demand_of", "refusal_answer"]

DEFAULT_COMPLETION_RESERVE = 256
"""Tokens reserved for an answer whose request names no `max_tokens`; settled on its usage."""
_BYTES_PER_TOKEN = 4
_FLOW_MAX = 128
_FAIRNESS_ID = b"x-gateway-inference-fairness-id"
_OBJECTIVE = b"x-gateway-inference-objective"
_NO_COMPLETION = frozenset({b"/v1/embeddings"})


class Demand(NamedTuple):
    """One request as flow control weighs it."""

    control: FlowControl
    tenant: Tenant
    priority: int
    flow: str
    completion: int
    """Tokens reserved for the answer."""
    body_size: int
    forward: bytes | None
    """The body as forwarded when the router asks for usage (None: the client's)."""

    def ask(self, model: str, prompt_tokens: int | None) -> Ask:
        """The ask for `model`, with the prompt's token count when known."""
        prompt = self.body_size // _BYTES_PER_TOKEN if prompt_tokens is None else prompt_tokens
        return Ask(self.tenant, self.priority, self.flow, model, prompt + self.completion)


def demand_of(
    control: FlowControl,
    credentials: Credentials,
    request: Request,
    body: dict[str, Any] | None,
) -> Demand:
    """`request`'s demand; `body` its parsed JSON when read on the loop (None: read by a
    worker, whose answer is only its model: the default reserve, usage not asked)."""
    headers = request.headers
    tenant = credentials.tenant_of(headers)
    priority = effective_priority(tenant, find_header(headers, _OBJECTIVE), credentials.tenants)
    flow = (find_header(headers, _FAIRNESS_ID) or b"")[:_FLOW_MAX].decode("latin-1")
    completion, forward = DEFAULT_COMPLETION_RESERVE, None
    if request.path in _NO_COMPLETION:
        completion = 0
    elif body is not None:
        completion = _completion_reserve(body)
        if body.get("stream") is True:
            forward = ask_usage(body, request.body)
    return Demand(control, tenant, priority, flow, completion, len(request.body), forward)


def _completion_reserve(body: Mapping[str, Any]) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return DEFAULT_COMPLETION_RESERVE


_STATUS = {"queue_timeout": 503, "no_engine": 503}
_ERROR = {
    "rate_limited": ("rate_limit_error", "rate_limit_exceeded"),
    "concurrency_limited": ("rate_limit_error", "rate_limit_exceeded"),
    "shed": ("overloaded_error", "shed"),
    "queue_full": ("overloaded_error", "queue_full"),
    "queue_timeout": ("service_unavailable", "queue_timeout"),
    "no_engine": ("service_unavailable", "no_engine_available"),
}


def refusal_answer(refusal: Refusal) -> tuple[ErrorAnswer, bytes]:
    """The OpenAI-shaped answer to a refusal and its header lines (`Retry-After`, and the
    `x-ratelimit-*` lines of a tenant with limits)."""
    error_type, code = _ERROR[refusal.outcome]
    status = _STATUS.get(refusal.outcome, 429)
    headers = JSON_HEADER + refusal.headers
    if refusal.retry_after > 0:
        headers += b"retry-after: %d\r\n" % math.ceil(refusal.retry_after)
    return ErrorAnswer(status, error_body(refusal.message, error_type, code)), headers
