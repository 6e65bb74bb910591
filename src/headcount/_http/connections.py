"""The open client connections of one server and what they share: a cap, a body budget, drain.

A connection is admitted only while fewer than `limit` are open: the one over
it is answered 503 and closed by its protocol, never left waiting (each one
holds a file descriptor, and running out of those fails every engine
connection too). All connections take request-body bytes from one
`BodyBudget`. The proxy drains on shutdown (idle connections close now, busy
ones after their response) and waits until no exchange is in flight.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Protocol

from headcount._http.budget import BodyBudget

__all__ = ["ClientConnection", "ConnectionRegistry"]


class ClientConnection(Protocol):
    """What the registry needs of a connection."""

    def drain(self) -> None: ...

    def close(self) -> None: ...


class ConnectionRegistry:
    """The open client connections of a server and how many exchanges are in flight."""

    __slots__ = ("_connections", "_idle", "_on_full", "active", "bodies", "draining", "limit")

    def __init__(
        self,
        limit: int = sys.maxsize,
        body_budget: int | BodyBudget = sys.maxsize,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        """`body_budget`: bytes, or a budget shared with another registry. `on_full()` hears
        of each connection refused because `limit` were open."""
        self._connections: set[ClientConnection] = set()
        self._idle: asyncio.Event | None = None
        self._on_full = on_full
        self.limit = limit
        self.bodies = (
            body_budget if isinstance(body_budget, BodyBudget) else BodyBudget(body_budget)
        )
        """Request-body bytes held by all connections together."""
        self.active = 0
        """Requests dispatched and not yet answered (or abandoned by their client)."""
        self.draining = False
        """Set by `drain`: a connection that arrives after it (accepted just before the
        listener closed) answers with `connection: close` too."""

    def __len__(self) -> int:
        return len(self._connections)

    def admit(self, connection: ClientConnection) -> bool:
        """Register `connection`; False if `limit` were already open (it must then be refused).

        A refused connection is registered all the same, until it is closed: it holds a
        file descriptor too, and shutdown must be able to close it.
        """
        full = len(self._connections) >= self.limit
        self._connections.add(connection)
        if full and self._on_full is not None:
            self._on_full()
        return not full

    def discard(self, connection: ClientConnection) -> None:
        self._connections.discard(connection)

    def exchange_done(self) -> None:
        self.active -= 1
        if self.active == 0 and self._idle is not None:
            self._idle.set()

    def drain(self) -> None:
        """Close idle connections; busy ones close after their current response."""
        self.draining = True
        for connection in list(self._connections):
            connection.drain()

    def close(self) -> None:
        """Drop every connection, abandoning whatever is in flight."""
        for connection in list(self._connections):
            connection.close()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no exchange is in flight; False if `timeout` passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.active > 0:
            self._idle = idle = asyncio.Event()
            try:
                await asyncio.wait_for(idle.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return self.active == 0
            finally:
                self._idle = None
        return True
