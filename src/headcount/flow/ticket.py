"""What flow control hears of one request and what it answers: the ask, a grant and its
ticket, or a refusal.

A granted request holds its `Ticket` until its end: its engine's slot (moved
on failover), its tenant's concurrency and its token reservation, all given
back by one `done` with the usage the engine reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from headcount.auth.tenants import Tenant
from headcount.fleet import Engine
from headcount.flow.limits import Verdict, ratelimit_headers

__all__ = ["Ask", "Choose", "Grant", "Refusal", "Ticket", "TicketOwner"]

Choose = Callable[[Sequence[Engine]], Engine | None]
"""The routing policy's pick among engines with room (None: it picks none)."""


class TicketOwner(Protocol):
    """Who a ticket gives its hold back to (`FlowControl`)."""

    def moved(self, old: str, new: str) -> None:
        """A granted request moved from engine `old` to engine `new` (failover)."""

    def ended(self, ticket: Ticket, prompt: int | None, completion: int | None) -> None:
        """A granted request ended, having used what the engine reported (None: unknown)."""


class Ask(NamedTuple):
    """What flow control needs of one request."""

    tenant: Tenant
    priority: int
    flow: str
    """`x-gateway-inference-fairness-id`, "" without one."""
    model: str
    tokens: int
    """Reserved: prompt tokens plus the most the request may generate."""


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
    """A granted request's hold on flow control, given back once by `done`."""

    __slots__ = ("_owner", "drop_usage", "engine_id", "headers", "reserved", "tenant", "window")

    def __init__(
        self, owner: TicketOwner, ask: Ask, engine_id: str, verdict: Verdict | None
    ) -> None:
        self._owner: TicketOwner | None = owner
        self.tenant = ask.tenant
        self.engine_id = engine_id
        counted = verdict is not None and verdict.tokens is not None
        self.reserved = ask.tokens if counted else 0
        """Tokens the store counted for this request, settled at its end (0: none)."""
        self.window = 0 if verdict is None else verdict.window
        self.headers = b"" if verdict is None else ratelimit_headers(verdict)
        """`x-ratelimit-*` lines the answer carries."""
        self.drop_usage = False
        """The router asked the engine for usage the client did not ask for: the answer's
        usage event is not the client's."""

    def moved(self, engine_id: str) -> None:
        """The request failed over to `engine_id`: its slot moves there."""
        owner = self._owner
        if owner is not None and engine_id != self.engine_id:
            owner.moved(self.engine_id, engine_id)
            self.engine_id = engine_id

    def done(self, prompt_tokens: int | None = None, completion_tokens: int | None = None) -> None:
        """The request ended: its slot and concurrency go back, its tokens are counted and
        its reservation settled on what the engine reported (kept whole when it said
        nothing). Called again, nothing happens."""
        owner = self._owner
        if owner is None:
            return
        self._owner = None
        owner.ended(self, prompt_tokens, completion_tokens)


class Grant(NamedTuple):
    """The engine a request goes to, and its ticket."""

    engine: Engine
    ticket: Ticket
