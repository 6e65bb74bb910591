"""HTTP/1.1 for clients: one callback-driven Protocol per connection, no Task per request.

One class holds one connection's whole state machine (parsing, ordering,
framing, flow control, idle timer), kept together so the per-request path
reads in one place; the contract with handlers is in `handler.py`.

Each connection parses requests with httptools; a request is dispatched once it
is whole (headers and body, the body at most `max_body_size`) to a
`RequestHandler`, which answers through the connection's `Responder` face at
once or later. Responses go out strictly in request order: pipelined requests
wait in a short queue (reading pauses while it is full), and an error found
while parsing request N+1 is answered after response N, then the connection
closes. What a client gets from this layer alone:

- keep-alive for HTTP/1.1 unless `Connection: close`; HTTP/1.0 closes unless it
  asks for keep-alive; a connection with no request in progress closes after
  `keepalive_timeout` (a request must arrive whole within that time too);
- `Expect: 100-continue` answered with `100 Continue` once the request is next
  in line, with 413 when its Content-Length is too large, 417 for any other
  expectation;
- 400 for a malformed request, 431 for a header block over `max_header_size`,
  413 for a body over `max_body_size` (from Content-Length before reading, or
  while reading chunks); errors in the OpenAI shape, then the connection closes;
- HEAD answered without a body; TCP_NODELAY on every connection (without it a
  stream on a reused connection waits ~40 ms for its first chunk: Nagle plus
  delayed ACK).

Flow control: when the client's socket buffer fills (`pause_writing`) the
exchange's `ExchangeListener` is told, so it can stop reading upstream. A
client that goes away mid-exchange (EOF or reset) is reported once, through
`ExchangeListener.client_lost`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import cast

import httptools

from headcount._http.connections import ConnectionRegistry
from headcount._http.handler import ExchangeListener, Request, RequestHandler
from headcount._http.wire import (
    CHUNKED_END,
    INTERNAL_ERROR_BODY,
    JSON_HEADER,
    REASONS,
    error_body,
)

__all__ = ["HttpServerProtocol", "ServerLimits"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds on what one client connection may send and how long it may idle.

    The values and the reasons for them are in `headcount.config.ProxySettings`.
    """

    max_header_size: int
    """Request line plus header fields; more gets 431."""
    max_body_size: int
    """More gets 413; bodies are held whole in memory before dispatch."""
    keepalive_timeout: float
    """Idle client connections close after this (a request must also arrive whole within it)."""
    max_pipeline: int
    """Requests parsed ahead of the one being answered before reading pauses."""


def _error_response(status: int, message: str, code: str) -> bytes:
    body = error_body(message, "invalid_request_error", code)
    return b"HTTP/1.1 %d %s\r\n%scontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
        status,
        REASONS[status],
        JSON_HEADER,
        len(body),
        body,
    )


_BAD_REQUEST = _error_response(400, "malformed HTTP request", "bad_request")
_HEADERS_TOO_LARGE = _error_response(
    431, "request header fields too large", "request_header_fields_too_large"
)
_BODY_TOO_LARGE = _error_response(413, "request body too large", "request_too_large")
_EXPECTATION_FAILED = _error_response(
    417, "only `Expect: 100-continue` is supported", "expectation_failed"
)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE_AFTER = b""
"""Queue marker: close once everything before it is answered (nothing more to say)."""
_CONNECTION_CLOSE = b"connection: close\r\n"
_CONNECTION_KEEP_ALIVE = b"connection: keep-alive\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"
_NO_BODY_STATUSES = frozenset({204, 304})
_LINGER_TIMEOUT = 2.0
"""After an error answer and our FIN, how long the client may keep sending before we close."""


class _Rejected(Exception):
    """Raised from a parser callback to stop parsing; the response is in `_reject`."""


class HttpServerProtocol(asyncio.Protocol):
    """One client connection: parses requests, answers them in order (it is their Responder)."""

    __slots__ = (
        "_active",
        "_body",
        "_body_size",
        "_chunked",
        "_close_after",
        "_content_length",
        "_continue",
        "_dispatching",
        "_draining",
        "_expect",
        "_handler",
        "_head_bytes",
        "_head_raw",
        "_headers",
        "_http11",
        "_idle_deadline",
        "_in_head",
        "_in_message",
        "_keep_alive",
        "_limits",
        "_listener",
        "_loop",
        "_method",
        "_no_body",
        "_on_rejected",
        "_parser",
        "_queue",
        "_read_paused",
        "_registry",
        "_reject",
        "_request",
        "_started",
        "_stopped",
        "_timer",
        "_transport",
        "_url",
        "_write_paused",
    )

    def __init__(
        self,
        handler: RequestHandler,
        limits: ServerLimits,
        registry: ConnectionRegistry,
        loop: asyncio.AbstractEventLoop,
        on_rejected: Callable[[int], None] | None = None,
    ) -> None:
        """`on_rejected(status)` hears of each request this layer answers itself (400, 413...)."""
        self._handler = handler
        self._on_rejected = on_rejected
        self._limits = limits
        self._registry = registry
        self._loop = loop
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._queue: deque[Request | bytes] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._idle_deadline = 0.0
        self._active = False
        self._dispatching = False
        self._draining = False
        self._stopped = False
        self._read_paused = False
        self._write_paused = False
        self._in_message = False
        self._in_head = False
        self._continue = False
        self._reject: bytes | None = None
        self._request: Request | None = None
        self._listener: ExchangeListener | None = None
        self._started = False
        self._chunked = False
        self._no_body = False
        self._close_after = False
        self._method = b""
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._expect: bytes | None = None
        self._reset_message()

    # -- connection events --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._registry.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._registry.discard(self)
        self._queue.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._active:
            listener = self._listener
            self._end_exchange()
            if listener is not None:
                listener.client_lost()

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._listener is not None:
            self._listener.client_paused()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._listener is not None:
            self._listener.client_resumed()

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The bytes after an upgrade request are not HTTP/1.1: answer it, then close.
            self._stop(_CLOSE_AFTER)
        except httptools.HttpParserError:
            self._stop(self._reject or _BAD_REQUEST)
        else:
            if self._in_head:
                # httptools joins a header value split over reads before calling on_header:
                # bound what it may accumulate (counted per read, so up to one read over).
                self._head_raw += len(data)
                if self._head_raw > 2 * self._limits.max_header_size:
                    self._stop(_HEADERS_TOO_LARGE)
        self._dispatch_pending()

    # -- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset_message()
        self._in_message = True
        self._in_head = True

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self._headers.append((name, value))
        self._count_head(len(name) + len(value) + 4)
        if name == b"content-length":
            self._content_length = int(value)
        elif name == b"expect":
            self._expect = value

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        self._method = parser.get_method()
        self._http11 = parser.get_http_version() == "1.1"
        self._keep_alive = parser.should_keep_alive()
        if self._content_length > self._limits.max_body_size:
            self._fail(_BODY_TOO_LARGE)
        if self._expect is not None and self._http11:
            if self._expect.lower() != b"100-continue":
                self._fail(_EXPECTATION_FAILED)
            self._continue = True
            if not self._active and not self._queue and self._transport is not None:
                self._transport.write(_CONTINUE)
                self._continue = False

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._limits.max_body_size:
            self._fail(_BODY_TOO_LARGE)
        self._body.append(body)

    def on_message_complete(self) -> None:
        parts = self._body
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        request = Request(
            self._method, self._url, self._headers, body, self._http11, self._keep_alive
        )
        self._in_message = False
        self._continue = False
        self._queue.append(request)
        if len(self._queue) >= self._limits.max_pipeline and not self._read_paused:
            self._read_paused = True
            if self._transport is not None:
                self._transport.pause_reading()

    # -- Responder ----------------------------------------------------------------------------

    def attach(self, listener: ExchangeListener) -> None:
        self._listener = listener
        if self._write_paused:
            listener.client_paused()

    def respond(self, status: int, header_block: bytes, body: bytes) -> None:
        transport = self._transport
        if transport is None or not self._active:
            return
        close = self._must_close()
        head = b"HTTP/1.1 %d %s\r\n%scontent-length: %d\r\n%s\r\n" % (
            status,
            REASONS.get(status, b""),
            header_block,
            len(body),
            self._connection_header(close),
        )
        transport.write(head if self._no_body else head + body)
        self._started = True
        self._finish(close)

    def start(
        self,
        status: int,
        reason: bytes,
        header_block: bytes,
        content_length: int | None,
        body: bytes,
        complete: bool,
    ) -> None:
        transport = self._transport
        if transport is None or not self._active:
            return
        close = self._must_close()
        if status in _NO_BODY_STATUSES or status < 200:
            framing = b""
            self._no_body = True
        elif content_length is not None:
            framing = b"content-length: %d\r\n" % content_length
        elif self._request is not None and self._request.http11:
            framing = _CHUNKED
            self._chunked = True
        else:
            framing = b""  # HTTP/1.0 client, length unknown: the body ends when we close
            close = True
        self._close_after = close
        head = b"HTTP/1.1 %d %s\r\n%s%s%s\r\n" % (
            status,
            reason,
            header_block,
            framing,
            self._connection_header(close),
        )
        self._started = True
        transport.write(head + self._frame(body, complete))
        if complete:
            self._finish(close)

    def write(self, body: bytes, complete: bool) -> None:
        transport = self._transport
        if transport is None or not self._active:
            return
        data = self._frame(body, complete)
        if data:
            transport.write(data)
        if complete:
            self._finish(self._close_after)

    def abort(self) -> None:
        transport = self._transport
        if transport is None or not self._active:
            return
        self._end_exchange()
        transport.close()

    def _frame(self, body: bytes, complete: bool) -> bytes:
        if self._no_body:
            return b""
        if not self._chunked:
            return body
        if not body:
            return CHUNKED_END if complete else b""
        if complete:
            return b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
        return b"%x\r\n%b\r\n" % (len(body), body)

    def _must_close(self) -> bool:
        request = self._request
        return request is None or not request.keep_alive or self._draining

    def _connection_header(self, close: bool) -> bytes:
        if close:
            return _CONNECTION_CLOSE
        if self._request is not None and not self._request.http11:
            return _CONNECTION_KEEP_ALIVE
        return b""

    # -- exchanges ----------------------------------------------------------------------------

    def _dispatch_pending(self) -> None:
        if self._active or self._dispatching:
            return
        queue = self._queue
        self._dispatching = True
        try:
            while queue and not self._active:
                transport = self._transport
                if transport is None:
                    return
                item = queue.popleft()
                if isinstance(item, bytes):
                    self._linger(transport, item)
                    return
                self._dispatch(item)
        finally:
            self._dispatching = False
        transport = self._transport
        if transport is None or self._active:
            return
        if self._read_paused and not self._stopped:
            self._read_paused = False
            transport.resume_reading()
        if self._continue:
            self._continue = False
            transport.write(_CONTINUE)

    def _dispatch(self, request: Request) -> None:
        self._active = True
        self._request = request
        self._listener = None
        self._started = False
        self._chunked = False
        self._no_body = request.is_head
        self._registry.active += 1
        try:
            self._handler(request, self)
        except Exception:
            _log.exception("request handler failed")
            if not self._active:
                return
            if self._started:
                self.abort()
            else:
                self.respond(500, JSON_HEADER, INTERNAL_ERROR_BODY)

    def _finish(self, close: bool) -> None:
        self._end_exchange()
        if close or self._draining:
            if self._transport is not None:
                self._transport.close()
            return
        self._arm_idle()
        if not self._dispatching:
            self._dispatch_pending()

    def _linger(self, transport: asyncio.Transport, response: bytes) -> None:
        """Send `response` and our FIN, then read and discard until the client closes.

        Closing at once with unread input makes the kernel send a reset, which can
        destroy the response before the client reads it (a client still sending a body
        that is too large, say).
        """
        if response:
            transport.write(response)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        if self._timer is not None:
            self._timer.cancel()
        self._idle_deadline = self._loop.time() + _LINGER_TIMEOUT
        self._timer = self._loop.call_at(self._idle_deadline, self._on_idle_timer)

    def _end_exchange(self) -> None:
        self._active = False
        self._request = None
        self._listener = None
        self._registry.exchange_done()

    def drain(self) -> None:
        """Answer what is in progress with `connection: close`; close now if nothing is."""
        self._draining = True
        if not self._active and not self._in_message and not self._queue and self._transport:
            self._transport.close()

    def close(self) -> None:
        """Drop the connection now, whatever it is doing."""
        if self._transport is not None:
            self._transport.abort()

    # -- parsing state ------------------------------------------------------------------------

    def _reset_message(self) -> None:
        self._method = b""
        self._url = b""
        self._headers = []
        self._body = []
        self._body_size = 0
        self._content_length = 0
        self._expect = None
        self._head_bytes = 0
        self._head_raw = 0
        self._http11 = True
        self._keep_alive = True

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._limits.max_header_size:
            self._fail(_HEADERS_TOO_LARGE)

    def _fail(self, response: bytes) -> None:
        self._reject = response
        raise _Rejected

    def _stop(self, response: bytes) -> None:
        """Parse nothing more: answer what came before, then `response`, then close."""
        if response and self._on_rejected is not None:
            self._on_rejected(int(response[9:12]))
        self._stopped = True
        self._in_message = False
        self._in_head = False
        self._queue.append(response)

    # -- idle timeout: one timer handle; each exchange only moves the deadline ---------------

    def _arm_idle(self) -> None:
        self._idle_deadline = self._loop.time() + self._limits.keepalive_timeout
        if self._timer is None:
            self._timer = self._loop.call_at(self._idle_deadline, self._on_idle_timer)

    def _on_idle_timer(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or self._active:
            return  # re-armed when the exchange finishes
        if self._loop.time() >= self._idle_deadline:
            transport.close()
        else:
            self._timer = self._loop.call_at(self._idle_deadline, self._on_idle_timer)
