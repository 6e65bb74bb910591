"""What flow control hears of a request, its `Ask`, and what it answers: a ticket to an
engine, a refusal, or an awaitable of one.

A granted request holds its `Ticket` until its end: its engine's slot (moved
on failover), its tenant's concurrency and its token reservation, all given
back by one `done` with the usage the engine reported.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from headcount.auth.tenants import Tenant
from headcount.fleet import Engine
from headcount.flow.limits import Verdict, ratelimit_headers
from headcount.flow.tally import TenantTally

__all__ = [
    "BYTES_PER_TOKEN",
    "DEFAULT_COMPLETION_RESERVE",
    "Admitter",
    "Ask",
    "Decision",
    "Picker",
    "Refusal",
    "Ticket",
    "TicketOwner",
    "completion_reserve",
]

DEFAULT_COMPLETION_RESERVE = 256
"""Tokens reserved for an answer whose request names no `max_tokens`; settled on its usage."""
BYTES_PER_TOKEN = 4
"""A prompt's bytes per token, where the router has not counted them."""


class Picker(Protocol):
    """The routing policy: its pick among engines with room for a request's `features`
    (None: it picks none). Flow control passes the features through unread."""

    def select(self, engines: Sequence[Engine], features: Any, /) -> Engine | None: ...


class Admitter(Protocol):
    """Who an `Ask` is made of (`FlowControl`)."""

    def admit(
        self, ask: Ask, candidates: Sequence[Engine], picker: Picker, features: Any
    ) -> Decision: ...


class Ask:
    """What flow control needs of one request. `model` is set by admission once known (the
    body may be read by a worker), `prompt` once counted (by the router's tokenizer); the
    reserve (`tokens`) is worked out only when something needs it (a limit, the queue),
    which most requests never do."""

    __slots__ = (
        "body",
        "completion",
        "control",
        "flow",
        "forward",
        "model",
        "priority",
        "prompt",
        "size",
        "tenant",
    )

    def __init__(
        self,
        control: Admitter,
        tenant: Tenant,
        priority: int,
        flow: str,
        body: Mapping[str, Any] | None,
        size: int,
        completion: int | None = None,
        forward: bytes | None = None,
    ) -> None:
        self.control = control
        self.tenant = tenant
        self.priority = priority
        self.flow = flow
        """`x-gateway-inference-fairness-id`, "" without one."""
        self.body = body
        """The request's JSON object (None: read by a worker, which answers only its model)."""
        self.size = size
        """The body's bytes."""
        self.completion = completion
        """Tokens reserved for the answer (None: as `body` asks, `completion_reserve`)."""
        self.forward = forward
        """The body as forwarded when the router asks for usage (None: the client's)."""
        self.model = ""
        self.prompt: int | None = None
        """The prompt's tokens, when counted (else its bytes / 4 stand for them)."""

    @property
    def tokens(self) -> int:
        """Reserved: the prompt's tokens plus the most the answer may use."""
        prompt = self.size // BYTES_PER_TOKEN if self.prompt is None else self.prompt
        completion = self.completion
        return prompt + (completion_reserve(self.body) if completion is None else completion)


def completion_reserve(body: Mapping[str, Any] | None) -> int:
    """The most a request's answer may use: its `max_completion_tokens`, else its
    `max_tokens`, else `DEFAULT_COMPLETION_RESERVE` (a count is an int of at least 0)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = None if body is None else body.get(name)
        if type(value) is int and value >= 0:  # not a bool
            return value
    return DEFAULT_COMPLETION_RESERVE


class TicketOwner(Protocol):
    """Who a ticket gives its hold back to (`FlowControl`)."""

    def moved(self, old: str, new: str) -> None:
        """A granted request moved from engine `old` to engine `new` (failover)."""

    def ended(self, ticket: Ticket, prompt: int | None, completion: int | None) -> None:
        """A granted request ended, having used what the engine reported (None: unknown)."""


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


class Ticket:
    """A granted request's engine and its hold on flow control, given back once by `done`."""

    __slots__ = (
        "_owner",
        "engine",
        "forward",
        "headers",
        "reserved",
        "tally",
        "tenant",
        "window",
    )

    def __init__(
        self,
        owner: TicketOwner,
        ask: Ask,
        engine: Engine,
        tally: TenantTally,
        verdict: Verdict | None,
    ) -> None:
        self._owner: TicketOwner | None = owner
        self.tenant = ask.tenant
        self.tally = tally
        """Its tenant's counts, which its tokens join at its end."""
        self.engine = engine
        """The engine the request is sent to (the last, after failovers)."""
        self.forward = ask.forward
        """The body to forward when it is not the client's: the router asked for usage the
        client did not ask for, so the answer's usage event is not the client's."""
        if verdict is None:
            self.headers, self.reserved, self.window = b"", 0, 0
        else:
            self.headers = ratelimit_headers(verdict)
            """`x-ratelimit-*` lines the answer carries."""
            self.reserved = 0 if verdict.tokens is None else ask.tokens
            """Tokens the store counted for this request, settled at its end (0: none)."""
            self.window = verdict.window

    def moved(self, engine: Engine) -> None:
        """The request failed over to `engine`: its slot moves there."""
        owner = self._owner
        if owner is not None and engine.id != self.engine.id:
            owner.moved(self.engine.id, engine.id)
            self.engine = engine

    def done(self, prompt_tokens: int | None = None, completion_tokens: int | None = None) -> None:
        """The request ended: its slot and concurrency go back, its tokens are counted and
        its reservation settled on what the engine reported (kept whole when it said
        nothing). Called again, nothing happens."""
        owner = self._owner
        if owner is None:
            return
        self._owner = None
        owner.ended(self, prompt_tokens, completion_tokens)


Decision = Ticket | Refusal | Awaitable[Ticket | Refusal]
"""What `admit` answers: a ticket, a refusal, or the wait for one."""
