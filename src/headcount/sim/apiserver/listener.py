"""The emulator's listening socket, which a fault takes away and gives back on the same port.

A client must see a refusing API server exactly as a restarting one: the
port stops accepting (ECONNREFUSED), open connections break, and later the
same address answers again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["Listener"]


class Listener:
    """An aiohttp runner and its TCP site; `port` is the one picked, kept across a refusal."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    async def start(self, app: web.Application) -> None:
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        await self._listen()

    @property
    def listening(self) -> bool:
        """Accepting connections: started, not refusing, not closed."""
        return self._site is not None

    async def refuse(self) -> None:
        """Stop listening (new connections: ECONNREFUSED) and abort every open connection."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        server = self._runner.server if self._runner is not None else None
        for connection in server.connections if server is not None else ():
            if connection.transport is not None:
                connection.transport.abort()

    async def restore(self) -> None:
        """Listen again on the same port, unless listening already or closed."""
        if self._site is None and self._runner is not None:
            await self._listen()

    async def close(self, before: Callable[[], Awaitable[None]]) -> None:
        """Close for good: from now on nothing listens again; `before` runs, then the socket
        and every connection go. Closing twice, or before starting, does nothing."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        await before()
        self._site = None
        await runner.cleanup()

    async def _listen(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self._site = site
        self.port = site.port
