"""Flow control's side of admission: whose a request is, what it may cost, how it hears no.

With a tenants file, every proxied request is an `Ask` of flow control: its
tenant (from its key), its priority (the tenant's, lowered by an
`x-gateway-inference-objective` the file names), its flow inside the tenant
(`x-gateway-inference-fairness-id`), and what flow control needs to work out
the tokens it reserves (`Ask.tokens`): its prompt's (counted by the router's
tokenizer when it has one, else its body's bytes / 4) plus the most it may
generate (`max_completion_tokens` or `max_tokens`, else
`DEFAULT_COMPLETION_RESERVE`; none for embeddings). A streamed request that does not ask for usage
is forwarded asking for it (`usage.ask_usage`), so that its tokens can be
settled; the usage chunk is then taken out of what the client receives.
"""

from __future__ import annotations

import math
from typing import Any

from headcount._http.handler import Request
from headcount._http.wire import JSON_HEADER, error_body
from headcount.auth import Credentials
from headcount.auth.tenants import Tenant, effective_priority
from headcount.flow.control import FlowControl
from headcount.flow.ticket import Ask, Refusal
from headcount.proxy.errors import ErrorAnswer
from headcount.proxy.usage import ask_usage

__all__ = ["ask_of", "refusal_answer"]

_FLOW_MAX = 128
_FAIRNESS_ID = b"x-gateway-inference-fairness-id"
_OBJECTIVE = b"x-gateway-inference-objective"
_NO_COMPLETION = frozenset({b"/v1/embeddings"})


def ask_of(
    control: FlowControl,
    credentials: Credentials,
    request: Request,
    body: dict[str, Any] | None,
) -> Ask:
    """`request`'s ask of `control`, its model not yet set; `body` its parsed JSON when read
    on the loop (None: read by a worker, whose answer is only its model: the default
    reserve, usage not asked)."""
    headers = request.headers
    tenant = request.identity
    if not isinstance(tenant, Tenant):  # open mode: the screen found no key to note
        tenant = credentials.tenant_of(headers)
    named = dict(headers)  # built in C: most requests carry neither header; the last one wins
    objective, flow = named.get(_OBJECTIVE), named.get(_FAIRNESS_ID)
    priority = tenant.priority
    if objective is not None:
        priority = effective_priority(tenant, objective, credentials.tenants)
    completion = forward = None
    if request.path in _NO_COMPLETION:
        completion = 0
    elif body is not None and body.get("stream") is True:
        forward = ask_usage(body, request.body)
    name = "" if flow is None else flow[:_FLOW_MAX].decode("latin-1")
    return Ask(control, tenant, priority, name, body, len(request.body), completion, forward)


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
