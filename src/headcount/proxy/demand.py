"""Flow control's side of admission: whose a request is, and how it hears no.

With a tenants file, every proxied request gets a `Ticket` (`flow/ticket.py`): its
tenant (from its key; `default` in open mode), and what flow control reads of it
only when the queue or a limit asks: its priority (the tenant's, lowered by an
`x-gateway-inference-objective` the file names), its flow inside the tenant
(`x-gateway-inference-fairness-id`) and the tokens it reserves (its prompt's,
counted by the router's tokenizer when it has one, else its body's bytes / 4,
plus the most it may generate: `max_completion_tokens` or `max_tokens`, else
`DEFAULT_COMPLETION_RESERVE`; none for embeddings). A streamed request that does
not ask for usage is forwarded asking for it (`usage.ask_usage`), so that its
tokens can be counted; the usage chunk is then taken out of what the client
receives. A refusal becomes an OpenAI-shaped answer with what the client should do.
"""

from __future__ import annotations

import math
from typing import Any

from headcount._http.handler import Request
from headcount._http.wire import JSON_HEADER, error_body
from headcount.auth import Credentials
from headcount.auth.tenants import Tenant
from headcount.flow.control import FlowControl
from headcount.flow.ticket import NO_COMPLETION_PATHS, Refusal, Ticket
from headcount.proxy.errors import ErrorAnswer
from headcount.proxy.usage import ask_usage

__all__ = ["refusal_answer", "ticket_of"]


def ticket_of(
    control: FlowControl,
    credentials: Credentials,
    request: Request,
    body: dict[str, Any] | None,
    model: str,
) -> Ticket:
    """`request`'s ticket for `model`; `body` its parsed JSON when read on the loop (None:
    read by a worker, whose answer is only its model: the default reserve, usage not
    asked)."""
    tenant = request.identity
    if not isinstance(tenant, Tenant):  # open mode: the screen found no key to note
        tenant = credentials.tenant_of(request.headers)
    forward = None
    if body is not None and body.get("stream") is True and request.path not in NO_COMPLETION_PATHS:
        forward = ask_usage(body, request.body)
    return Ticket(control, tenant, request, model, body, forward)


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
