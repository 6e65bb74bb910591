"""One request under flow control, its `Ticket`, and what flow control answers it: the ticket
granted an engine, a refusal, or an awaitable of one.

A ticket is made when the request is admitted, with the least its common path needs
(its tenant, and the body to forward when usage is asked for); what only the queue or a
limit needs (its priority, its flow, the tokens it reserves) is read from the request
when they ask. Granted, it holds its engine's slot (moved on failover), its tenant's
concurrency and its token reservation until one `done` gives them back with the usage
the engine reported.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from headcount._http.handler import Request
from headcount.auth.tenants import Tenant, Tenants, effective_priority
from headcount.fleet import Engine
from headcount.flow.limits import Verdict, ratelimit_headers
from headcount.flow.tally import TenantTally

__all__ = [
    "DEFAULT_COMPLETION_RESERVE",
    "NO_COMPLETION_PATHS",
    "Decision",
    "Owner",
    "Picker",
    "Refusal",
    "Ticket",
    "completion_reserve",
]

DEFAULT_COMPLETION_RESERVE = 256
"""Tokens reserved for an answer whose request names no `max_tokens`; settled on its usage."""
_BYTES_PER_TOKEN = 4
"""A prompt's bytes per token, where the router has not counted them."""
_OBJECTIVE = b"x-gateway-inference-objective"
_FAIRNESS_ID = b"x-gateway-inference-fairness-id"
_FLOW_MAX = 128
"""Bytes of a fairness id kept: longer ones name the same flow as their first 128."""
NO_COMPLETION_PATHS = frozenset(
    {
        b"/v1/embeddings",
        b"/v1/rerank",
        b"/rerank",
        b"/v2/rerank",
        b"/v1/score",
        b"/score",
        b"/classify",
        b"/pooling",
        b"/tokenize",
        b"/detokenize",
    }
)
"""Paths whose answers generate nothing: their reserve is their prompt, usage is not asked."""


class Picker(Protocol):
    """The routing policy: its pick among engines with room for a request's `features`
    (None: it picks none). Flow control passes the features through unread."""

    def select(self, engines: Sequence[Engine], features: Any, /) -> Engine | None: ...


class Owner:
    """Who a ticket asks and gives its hold back to: `FlowControl`, its one subclass. A base
    class rather than a Protocol, as control.py imports this module and not the reverse:
    compiled, a call through a Protocol is a Python method call, through a class a native
    one (a few hundred instructions less per request)."""

    tenants: Callable[[], Tenants | None]
    """The tenants file in force (for its objectives)."""

    def admit(
        self, ticket: Ticket, candidates: Sequence[Engine], picker: Picker, features: Any
    ) -> Decision:
        raise NotImplementedError

    def moved(self, old: Engine, new: Engine) -> None:
        """A granted request moved from engine `old` to engine `new` (failover)."""
        raise NotImplementedError

    def ended(
        self, ticket: Ticket, tally: TenantTally, prompt: int | None, completion: int | None
    ) -> None:
        """A granted request ended, having used what the engine reported (None: unknown)."""
        raise NotImplementedError


class Ticket:
    """One request's way through flow control; see the module docstring."""

    __slots__ = (
        "body",
        "control",
        "engine",
        "forward",
        "headers",
        "model",
        "prompt",
        "request",
        "reserve",
        "tally",
        "tenant",
        "verdict",
    )

    engine: Engine
    """The engine the request is sent to (the last, after failovers); set by its grant."""

    def __init__(
        self,
        control: Owner,
        tenant: Tenant,
        request: Request,
        model: str,
        body: Mapping[str, Any] | None,
        forward: bytes | None = None,
    ) -> None:
        self.control = control
        self.tenant = tenant
        self.request = request
        self.body = body
        """The request's JSON object until its reserve is worked out or it is granted (None
        then, or when a worker read it, which answers only its model)."""
        self.forward = forward
        """The body to forward when it is not the client's: the router asked for usage the
        client did not ask for, so the answer's usage event is not the client's."""
        self.model = model
        self.prompt: int | None = None
        """The prompt's tokens, when the router counted them (else its bytes / 4 stand in)."""
        self.reserve: int | None = None
        """`tokens`, once worked out."""
        self.tally: TenantTally | None = None
        """Its tenant's counts while it holds a slot: None before its grant and after `done`."""
        self.verdict: Verdict | None = None
        """The limits store's judgement, for a tenant with limits."""
        self.headers = b""
        """`x-ratelimit-*` lines the answer carries."""

    @property
    def priority(self) -> int:
        """Its tenant's, lowered by an `x-gateway-inference-objective` the file names."""
        objective = dict(self.request.headers).get(_OBJECTIVE)
        return effective_priority(self.tenant, objective, self.control.tenants())

    @property
    def flow(self) -> str:
        """`x-gateway-inference-fairness-id` (its first `_FLOW_MAX` bytes), "" without one."""
        named = dict(self.request.headers).get(_FAIRNESS_ID)
        return "" if named is None else named[:_FLOW_MAX].decode("latin-1")

    @property
    def tokens(self) -> int:
        """Reserved: the prompt's tokens plus the most the answer may use, worked out once
        (the parsed body is let go then)."""
        reserve = self.reserve
        if reserve is None:
            request = self.request
            reserve = len(request.body) // _BYTES_PER_TOKEN if self.prompt is None else self.prompt
            if request.path not in NO_COMPLETION_PATHS:
                reserve += completion_reserve(self.body)
            self.reserve, self.body = reserve, None
        return reserve

    def judged(self, verdict: Verdict) -> None:
        """The limits store counted the request: the answer says what is left."""
        self.verdict = verdict
        self.headers = ratelimit_headers(verdict)

    def moved(self, engine: Engine) -> None:
        """The request failed over to `engine`: its slot moves there."""
        if self.tally is not None and engine.id != self.engine.id:
            self.control.moved(self.engine, engine)
            self.engine = engine

    def settle(self, reported: tuple[int | None, int | None] | None, status: int) -> None:
        """The request ended with an answer of `status` reporting `reported` tokens (None:
        none read): an answer that is no success used none, a success that reported none
        (cut) keeps its reservation."""
        if reported is not None:
            self.done(reported[0], reported[1])
        elif not 200 <= status < 300:
            self.done(0, 0)
        else:
            self.done()

    def done(self, prompt_tokens: int | None = None, completion_tokens: int | None = None) -> None:
        """The request ended: its slot and concurrency go back, its tokens are counted and
        its reservation settled on what the engine reported (kept whole when it said
        nothing). Before its grant or called again, nothing happens."""
        tally = self.tally
        if tally is None:
            return
        self.tally = None
        self.control.ended(self, tally, prompt_tokens, completion_tokens)


def completion_reserve(body: Mapping[str, Any] | None) -> int:
    """The most a request's answer may use: its `max_completion_tokens`, else its
    `max_tokens`, else `DEFAULT_COMPLETION_RESERVE` (a count is an int of at least 0)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = None if body is None else body.get(name)
        if type(value) is int and value >= 0:  # not a bool
            return value
    return DEFAULT_COMPLETION_RESERVE


class Refusal(NamedTuple):
    """Why a request is refused and when the client may try again."""

    outcome: str
    """The metric's outcome: `concurrency_limited`, `shed`, `queue_full`, `rate_limited`,
    `queue_timeout`, or `no_engine` (the policy picked none)."""
    message: str
    retry_after: float
    """Seconds (at least 1); 0 when waiting cannot help (the request alone is over a limit)."""
    headers: bytes
    """`x-ratelimit-*` lines for a tenant with limits (b"" otherwise)."""


Decision = Ticket | Refusal | Awaitable[Ticket | Refusal]
"""What `admit` answers: the ticket granted an engine, a refusal, or the wait for one."""
