"""The open client connections of one server: draining and closing them together.

The proxy drains on shutdown (idle connections close now, busy ones after
their response) and waits until no exchange is in flight.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

__all__ = ["ClientConnection", "ConnectionRegistry"]


class ClientConnection(Protocol):
    """What the registry needs of a connection."""

    def drain(self) -> None: ...

    def close(self) -> None: ...


class ConnectionRegistry:
    """The open client connections of a server and how many exchanges are in flight."""

    __slots__ = ("_connections", "_idle", "active")

    def __init__(self) -> None:
        self._connections: set[ClientConnection] = set()
        self._idle: asyncio.Event | None = None
        self.active = 0
        """Requests dispatched and not yet answered (or abandoned by their client)."""

    def add(self, connection: ClientConnection) -> None:
        self._connections.add(connection)

    def discard(self, connection: ClientConnection) -> None:
        self._connections.discard(connection)

    def exchange_done(self) -> None:
        self.active -= 1
        if self.active == 0 and self._idle is not None:
            self._idle.set()

    def drain(self) -> None:
        """Close idle connections; busy ones close after their current response."""
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
