"""The failure modes a router must survive, as gates the engine's handlers pass through.

`hang` holds every gate until the mode changes; `http-500` answers the API
with an OpenAI-shaped 500; `die-mid-stream` drops the connection two chunks
into a stream, or instead of a whole answer. `refuse` closes sockets, which
only the server itself does (`SimEngine`).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from headcount.sim.engine.config import FailMode
from headcount.sim.engine.wire import JSON, error_body

__all__ = ["FailureGate", "die"]

_DIE_AFTER_CHUNKS = 2
_HTTP_500_BODY = error_body(
    500, "simulated engine failure (fail mode http-500)", "InternalServerError"
)


class FailureGate:
    """The current failure mode, and what it does to a request passing through."""

    def __init__(self, mode: FailMode) -> None:
        self._mode = mode
        self._unhung = asyncio.Event()
        self._set_hang_gate()

    @property
    def mode(self) -> FailMode:
        return self._mode

    def switch(self, mode: FailMode) -> None:
        self._mode = mode
        self._set_hang_gate()

    async def wait_while_hung(self) -> None:
        while self._mode == "hang":
            await self._unhung.wait()

    async def refusal(self) -> web.Response | None:
        """Hang while hung; the 500 answer in `http-500`; None when the request may proceed."""
        await self.wait_while_hung()
        if self._mode == "http-500":
            return web.Response(status=500, body=_HTTP_500_BODY, content_type=JSON)
        return None

    def dying(self, sent: int) -> bool:
        """Whether a response that has sent `sent` chunks must die now."""
        return self._mode == "die-mid-stream" and sent >= _DIE_AFTER_CHUNKS

    def _set_hang_gate(self) -> None:
        if self._mode == "hang":
            self._unhung.clear()
        else:
            self._unhung.set()


def die(request: web.Request) -> None:
    """Drop the connection, as a crashing engine does; aiohttp then writes nothing more."""
    if request.transport is not None:
        request.transport.abort()
