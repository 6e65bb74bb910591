"""One keep-alive connection to an engine: a request out, exactly one response back.

The connection calls `listener.on_response(head, body, complete)` once per
upstream read that carried anything (so the proxy writes once per read), and
`listener.on_upstream_error(error)` at most once, with an `errors.UpstreamError`.
When a response completes and both sides allow keep-alive, the connection goes
back to its pool (`pool.py`) before the listener hears `complete`. Responses
may be framed by content-length, chunked, or the end of the connection.

One request, exactly one relayed response. Interim 1xx responses are dropped
(RFC 9110 §15.2: no body; a 101 was never asked for and ends the exchange);
no body byte is relayed before the final head; a status outside 100-599, a
head over `max_head_size`, or any byte after the complete response is a
`ProtocolViolation`. A connection goes back to its pool only after a clean,
complete exchange whose request was fully written.

Timers: one handle per connection for its whole life. It fires at least every
`min(read_timeout, idle_timeout)` and compares the time against a deadline that
each read only moves, so no request schedules or cancels anything.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from contextlib import suppress
from typing import NoReturn, Protocol, cast

import httptools
from mypy_extensions import mypyc_attr

from headcount._http.errors import (
    NoResponse,
    ProtocolViolation,
    StaleConnection,
    StreamBroken,
    UpstreamError,
    UpstreamTimeout,
)
from headcount._http.head import Head, HeadReader

__all__ = ["ConnectionOwner", "ResponseHead", "ResponseListener", "UpstreamConnection"]

_NO_BODY_STATUSES = frozenset({204, 304})
_NOTED = (b"transfer-encoding",)
"""Besides Content-Length, the header that says how a response's body ends."""
_KEEPALIVE_TUNING = tuple(
    (getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)
)
"""Probe a silent engine after 30 s, give up after 3 more tries 10 s apart: a dead host
(no FIN, no RST) is found in about a minute instead of Linux's default two hours."""


class ResponseHead(Head):
    """Status line and headers of an engine's response; header names lowercased.

    The connection reads each response's head into a fresh one and hands the final one
    over as it is (`status` is set once the head is whole).
    """

    __slots__ = ("chunked", "reason", "status")

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self.size = 0
        self.raw = 0
        self.status = 0
        self.reason = b""
        self.chunked = False


class ConnectionOwner(Protocol):
    """What a connection needs of the pool that opened it: its timing, its limit, and
    where the connection goes when it is idle again or gone."""

    read_timeout: float
    """Longest silence between two bytes of a response."""
    idle_timeout: float
    """How long an idle connection may wait in the pool."""
    tick: float
    """How often the connection's one timer looks at its deadline."""
    max_head_size: int

    def release(self, connection: UpstreamConnection) -> None:
        """A clean, complete exchange: the connection may be reused."""

    def discard(self, connection: UpstreamConnection) -> None:
        """The connection is closing: it must not be handed out again."""


@mypyc_attr(allow_interpreted_subclasses=True)
class ResponseListener:
    """Who hears one response on an upstream connection: a base class rather than a Protocol,
    so that the call at each read is a native one where the listener is compiled (a stream's
    every piece reaches its `Exchange` so)."""

    def on_response(self, head: ResponseHead | None, body: bytes, complete: bool) -> None:
        """One upstream read: the head (first time only), the body bytes it carried, whether
        the response is now whole. When `complete`, the connection is already released."""
        raise NotImplementedError

    def on_upstream_error(self, error: UpstreamError) -> None:
        """The response will not complete; the connection is closed. Called at most once."""
        raise NotImplementedError


class _Violation(Exception):
    """Raised from a parser callback to stop parsing; the reason is in `_violation`."""


class UpstreamConnection(HeadReader[ResponseHead]):
    """One keep-alive connection to an engine, parsing responses with httptools."""

    __slots__ = (
        "_body",
        "_complete",
        "_deadline",
        "_feed",
        "_head",
        "_in_head",
        "_interim",
        "_keep_alive",
        "_listener",
        "_loop",
        "_now",
        "_parser",
        "_paused",
        "_pool",
        "_received",
        "_sent",
        "_timer",
        "_transport",
        "_until_close",
        "_violation",
        "closed",
    )

    def __init__(self, pool: ConnectionOwner, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(ResponseHead(), pool.max_head_size, _NOTED)
        self._pool = pool
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        # Bound once: compiled, a call of a bound method skips the method's lookup, per read.
        self._feed: Callable[[bytes], None] = self._parser.feed_data
        self._now: Callable[[], float] = loop.time
        self._transport: asyncio.Transport | None = None
        self._listener: ResponseListener | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._sent = 0
        self._paused = False
        self._in_head = False
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self._received = False
        self._body: list[bytes] = []
        self._head: ResponseHead | None = None
        """The final head, until the listener has it."""
        self._complete = False
        self._interim = False
        self._until_close = False
        self._keep_alive = True
        self._violation = ""

    # -- used by the proxy --------------------------------------------------------------------

    @property
    def answering(self) -> bool:
        """Whether any byte of the response to the current request has arrived."""
        return self._received

    @property
    def last_read(self) -> float:
        """When the response's last byte arrived (loop time; later, while the client paused)."""
        return self._deadline - self._pool.read_timeout

    def send(self, request: bytes, listener: ResponseListener) -> None:
        """Write a whole request; `listener` hears about its response."""
        self._reset()
        self._listener = listener
        self._sent += 1
        self._deadline = self._now() + self._pool.read_timeout
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if self._paused:
                self._paused = False
                transport.resume_reading()
            transport.write(request)
        # else: the engine closed it a moment ago; connection_lost reports a stale connection

    def cancel(self) -> None:
        """Abandon the exchange in progress; the connection is closed, never reused."""
        self._listener = None
        self.close()

    def close(self) -> None:
        if not self.closed and self._transport is not None:
            self.closed = True
            self._transport.abort()

    def pause_reading(self) -> None:
        if not self.closed and self._transport is not None and not self._paused:
            self._paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.closed and self._transport is not None and self._paused:
            self._paused = False
            self._deadline = self._now() + self._pool.read_timeout
            self._transport.resume_reading()

    # -- connection events --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for option, value in _KEEPALIVE_TUNING:
                    sock.setsockopt(socket.IPPROTO_TCP, option, value)
        self._deadline = self._now() + self._pool.tick
        self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def data_received(self, data: bytes) -> None:
        listener = self._listener
        if listener is None:
            self.close()  # bytes nobody asked for: this connection cannot be trusted
            return
        self._received = True
        self._deadline = self._now() + self._pool.read_timeout
        try:
            self._feed(data)
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolViolation("an upgrade nobody asked for"))
            return
        except httptools.HttpParserError as exc:
            if self._violation:
                self._fail(ProtocolViolation(self._violation))
            else:
                self._fail(StreamBroken(f"malformed response: {exc}"))
            return
        if self._in_head and self._count_raw(len(data)):  # all of it: up to one read over
            self._fail(ProtocolViolation(self._too_large()))
            return
        head = self._head
        self._head = None
        parts = self._body
        if parts:
            self._body = []
            body = parts[0] if len(parts) == 1 else b"".join(parts)
        elif head is None and not self._complete:
            return
        else:
            body = b""
        complete = self._complete
        if complete:
            self._listener = None
            self._release()
        listener.on_response(head, body, complete)

    def eof_received(self) -> bool | None:
        self._pool.discard(self)  # closing now; connection_lost decides what the end means
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pool.discard(self)
        listener = self._listener
        if listener is None:
            return
        self._listener = None
        if self._until_close and exc is None:
            listener.on_response(None, b"", True)  # the end of the connection ends the body
            return
        error: UpstreamError
        if self._received:
            error = StreamBroken(f"connection lost mid-response: {exc or 'closed'}")
        elif self._sent > 1:
            error = StaleConnection(f"reused connection closed: {exc or 'closed'}")
        else:
            error = NoResponse(f"connection closed before any response byte: {exc or 'closed'}")
        listener.on_upstream_error(error)

    # -- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            self._violate("bytes after the complete response")
        self._message = ResponseHead()  # an interim response's head is forgotten
        self._in_head = True

    def on_status(self, reason: bytes) -> None:
        self._message.reason += reason
        self._count_head(len(reason))

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        status: int = parser.get_status_code()
        if not 100 <= status <= 599:
            self._violate(f"status {status} is outside 100-599")
        if status < 200:
            if status == 101:
                self._violate("101 Switching Protocols, and no upgrade was asked for")
            self._interim = True  # 100 Continue, 103 Early Hints: the final response follows
            return
        self._keep_alive = parser.should_keep_alive()
        head = self._message
        head.status = status
        self._until_close = (
            head.content_length is None and not head.chunked and status not in _NO_BODY_STATUSES
        )
        self._head = head

    def on_body(self, body: bytes) -> None:
        if self._interim:
            self._violate("a body on an interim response")
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._complete = True

    # -- internals ----------------------------------------------------------------------------

    def _violate(self, what: str) -> NoReturn:
        """Stop parsing: `data_received` turns this into a `ProtocolViolation`."""
        self._violation = what
        raise _Violation

    def _note(self, name: bytes, value: bytes) -> None:
        # the one name in `_NOTED`; `find`, as a bytes `in` formats an exception first
        self._message.chunked = value.lower().find(b"chunked") >= 0

    def _head_too_large(self) -> NoReturn:
        self._violate(self._too_large())

    def _too_large(self) -> str:
        return f"response head over {self._max_head_size} bytes"

    def _release(self) -> None:
        # The last read moved the deadline to now + read_timeout; from now on it is idle.
        self._deadline += self._pool.idle_timeout - self._pool.read_timeout
        transport = self._transport
        unsent = transport is None or transport.get_write_buffer_size() > 0
        if self._keep_alive and not self.closed and not unsent:
            self._pool.release(self)
        else:
            self.close()  # an answer before the whole request went out: the rest would desync

    def _fail(self, error: UpstreamError) -> None:
        listener = self._listener
        self._listener = None
        self.close()
        if listener is not None:
            listener.on_upstream_error(error)

    def _on_timer(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = self._now()
        if self._paused:
            self._deadline = now + self._pool.read_timeout  # the client is slow, not the engine
        elif now >= self._deadline:
            if self._listener is None:
                self.close()  # idle too long in the pool
            else:
                self._fail(UpstreamTimeout(f"no response byte for {self._pool.read_timeout:g}s"))
            return
        self._timer = self._loop.call_at(min(self._deadline, now + self._pool.tick), self._on_timer)
