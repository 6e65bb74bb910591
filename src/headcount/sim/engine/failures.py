"""The failure modes a router must survive, as gates the engine's handlers pass through.

`hang` holds every gate until the mode changes; `stall` holds only
generation's (a wedged engine loop behind a live HTTP server: probes and
`/v1/models` answer, completions and embeddings never start and running
streams stop); `http-500` answers the API with an OpenAI-shaped 500;
`die-mid-stream` drops the connection two chunks into a stream, or instead of
a whole answer. `refuse` closes sockets, which
only the server itself does (`SimEngine`).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from headcount.sim.engine.config import FailMode
from headcount.sim.engine.wire import JSON, error_body

__all__ = ["FailureGate", "die"]

_DIE_AFTER_CHUNKS = 2
_STALLING = frozenset({"hang", "stall"})
_HTTP_500_BODY = error_body(
    500, "simulated engine failure (fail mode http-500)", "InternalServerError"
)


class FailureGate:
    """The current failure mode, and what it does to a request passing through."""

    def __init__(self, mode: FailMode) -> None:
        self._mode = mode
        self._unhung = asyncio.Event()
        self._unstalled = asyncio.Event()
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

    async def wait_while_stalled(self) -> None:
        """Hang while hung or stalled: generation's gate."""
        while self._mode in _STALLING:
            await self._unstalled.wait()

    async def refusal(self, *, generation: bool = False) -> web.Response | None:
        """Hang while hung (or stalled, for `generation`); the 500 answer in `http-500`; None
        when the request may proceed."""
        await (self.wait_while_stalled() if generation else self.wait_while_hung())
        if self._mode == "http-500":
            return web.Response(status=500, body=_HTTP_500_BODY, content_type=JSON)
        return None

    def dying(self, sent: int) -> bool:
        """Whether a response that has sent `sent` chunks must die now."""
        return self._mode == "die-mid-stream" and sent >= _DIE_AFTER_CHUNKS

    def _set_hang_gate(self) -> None:
        for gate, closed in (
            (self._unhung, self._mode == "hang"),
            (self._unstalled, self._mode in _STALLING),
        ):
            if closed:
                gate.clear()
            else:
                gate.set()


def die(request: web.Request) -> None:
    """Drop the connection, as a crashing engine does; aiohttp then writes nothing more."""
    if request.transport is not None:
        request.transport.abort()
