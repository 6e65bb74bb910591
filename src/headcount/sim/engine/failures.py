"""The failure modes a router must survive, as gates the engine's handlers pass through.

`hang` holds every gate until the mode changes; `stall` holds only
generation's (a wedged engine loop behind a live HTTP server: probes and
`/v1/models` answer, completions and embeddings never start and running
streams stop); `http-500` answers the API with an OpenAI-shaped 500.
`refuse` closes sockets, which only the server itself does (`SimEngine`).

The mid-stream modes break a stream once it has sent `after_chunks` chunks
(its usage chunk and `[DONE]` counted as one more), as a router resuming
streams meets them:

- `die-mid-stream`: the connection is reset (RST, not FIN: an engine process
  that crashed, or a node gone), as is a whole answer's instead of sending it.
- `truncate-mid-stream`: the first half of the next chunk (an SSE event cut
  inside its JSON), then the connection closes without HTTP's last chunk; a
  whole answer's first half, under a `Content-Length` promising all of it.
- `stall-mid-stream`: nothing more, the connection open, until the mode
  changes; then the stream goes on (or breaks, for another mid-stream mode).
  Everything else answers: probes, `/v1/models`, new requests (whose streams
  stall in their turn), whole answers.

A stream shorter than `after_chunks` chunks ends normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Literal

from aiohttp import web

from headcount.sim.engine.config import MID_STREAM_MODES, FailMode
from headcount.sim.engine.wire import JSON, error_body

__all__ = ["Break", "FailureGate", "break_answer", "break_stream", "check", "die"]

Break = Literal["die-mid-stream", "truncate-mid-stream"]
"""How a stream or a whole answer breaks."""

_STALLING = frozenset({"hang", "stall"})
_HTTP_500_BODY = error_body(
    500, "simulated engine failure (fail mode http-500)", "InternalServerError"
)
_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 seconds: close sends RST and drops what is unsent."""


class FailureGate:
    """The current failure mode, and what it does to a request passing through."""

    def __init__(self, mode: FailMode, after_chunks: int = 2) -> None:
        self._mode = mode
        self._after_chunks = after_chunks
        self._unhung = asyncio.Event()
        self._unstalled = asyncio.Event()
        self._changed = asyncio.Event()
        self._set_hang_gate()

    @property
    def mode(self) -> FailMode:
        return self._mode

    @property
    def after_chunks(self) -> int:
        """Chunks a stream sends before a mid-stream mode breaks it."""
        return self._after_chunks

    def switch(self, mode: FailMode, after_chunks: int) -> None:
        """Change mode; `after_chunks` counts for the mid-stream modes."""
        if after_chunks < 0:
            raise ValueError("after_chunks must be at least 0")
        self._mode = mode
        self._after_chunks = after_chunks
        self._set_hang_gate()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()  # stalled streams look again

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

    async def mid_stream(self, sent: int) -> Break | None:
        """Before a stream that has sent `sent` chunks sends the next: hold it while
        `stall-mid-stream` has it, then how it must break, or None to go on."""
        while self._mode == "stall-mid-stream" and sent >= self._after_chunks:
            await self._changed.wait()
        return self.whole_answer_break() if sent >= self._after_chunks else None

    def whole_answer_break(self) -> Break | None:
        """How a whole (not streamed) answer must break, or None to send it."""
        mode = self._mode
        if mode == "die-mid-stream" or mode == "truncate-mid-stream":
            return mode
        return None

    def _set_hang_gate(self) -> None:
        for gate, closed in (
            (self._unhung, self._mode == "hang"),
            (self._unstalled, self._mode in _STALLING),
        ):
            if closed:
                gate.clear()
            else:
                gate.set()


def check(mode: FailMode, after_chunks: int | None) -> None:
    """`ValueError` unless `after_chunks`, if given (None: the config's `die_after_chunks`),
    fits `mode`: a mid-stream mode's count of chunks, at least 0."""
    if after_chunks is None:
        return
    if mode not in MID_STREAM_MODES:
        raise ValueError(f"after_chunks applies only to {', '.join(sorted(MID_STREAM_MODES))}")
    if isinstance(after_chunks, bool) or not isinstance(after_chunks, int) or after_chunks < 0:
        raise ValueError("after_chunks must be an integer, at least 0")


def die(request: web.Request) -> None:
    """Reset the connection, as a crashing engine's kernel does; aiohttp then writes nothing
    more."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already gone: aborting is all that is left
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    transport.abort()


def _close(request: web.Request) -> None:
    """Close the connection once what is written is sent (FIN); aiohttp then writes nothing
    more, not even a chunked body's end."""
    if request.transport is not None:
        request.transport.close()


async def break_stream(
    request: web.Request, response: web.StreamResponse, how: Break, chunk: bytes
) -> None:
    """Break a prepared stream whose next chunk would have been `chunk`."""
    if how == "die-mid-stream":
        die(request)
        return
    await response.write(chunk[: len(chunk) // 2])
    _close(request)


async def break_answer(request: web.Request, how: Break, body: bytes) -> web.StreamResponse:
    """Break a whole answer that would have been `body`: the response to return."""
    if how == "die-mid-stream":
        die(request)
        return web.Response(content_type=JSON)
    response = web.StreamResponse()
    response.content_type = JSON
    response.content_length = len(body)
    await response.prepare(request)
    await response.write(body[: len(body) // 2])
    _close(request)
    return response
