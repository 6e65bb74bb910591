"""HTTP/1.1 for clients: one callback-driven Protocol per connection, no Task per request.

One object is one connection: this module is its answering half (ordering,
framing, flow control, deadlines), `reader.py` its reading half, a base class,
so that every parser callback reaches the connection's state directly. The
contract with handlers is in `handler.py`, the canned answers in `answers.py`.

Each connection parses requests with httptools; a request is dispatched once it
is whole (headers and body, the body at most `max_body_size`) to a
`RequestHandler`, which answers through the connection's `Responder` face at
once or later. Responses go out strictly in request order: pipelined requests
wait in a short queue (reading pauses while it is full), and an error found
while parsing request N+1 is answered after response N, then the connection
closes. What a client gets from this layer alone:

- keep-alive for HTTP/1.1 unless `Connection: close`; HTTP/1.0 closes unless it
  asks for keep-alive;
- deadlines: a connection with no request in progress closes after
  `idle_timeout`; a request head must arrive whole within `header_timeout` of
  the read that began it, and its body within `idle_timeout` of the read that
  ended the head (else 408); a client that reads nothing of a pending response
  for `send_timeout` is disconnected (its exchange hears `client_lost`);
- `Expect: 100-continue` answered with `100 Continue` once the request is next
  in line, with 413 when its Content-Length is too large, 417 for any other
  expectation;
- 400 for a malformed request, for an HTTP/1.1 request without exactly one
  `Host` (RFC 9112 §3.2) and for a request line without a version (HTTP/0.9);
  505 for `HTTP/2.0`; 431 for a header block over `max_header_size`; 413 for a
  body over `max_body_size` (from Content-Length before reading, or while
  reading chunks); 503 `overloaded` when the bytes arriving do not fit in the
  server's shared `BodyBudget`, and 503 `too_many_connections` to a connection
  over the registry's limit; all in the OpenAI shape, then the connection closes;
- a request its `HeadScreen` answers from its head (no key, a path that takes
  no body) is dispatched to the handler the screen named; its body is never
  read nor held, so if it has one the answer says `connection: close` and the
  connection lingers and closes (no `100 Continue`, no 413 first);
- HEAD answered without a body; TCP_NODELAY on every connection (without it a
  stream on a reused connection waits out Nagle plus delayed ACK for its first
  chunk).

Flow control: when the client's socket buffer fills (`pause_writing`) the
exchange's `ExchangeListener` is told, so it can stop reading upstream, and no
further pipelined request is dispatched until the client reads
(`resume_writing`): a client that never reads cannot make the router produce
answers it will not take. A client that goes away mid-exchange (EOF or reset)
is reported once, through `ExchangeListener.client_lost`.

Over 450 lines on purpose: what the answering half tracks (the exchange, flow
control each way, shutdown, the one deadline) moves together, and reads in one place.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from contextlib import suppress
from typing import cast

from headcount._http import answers
from headcount._http.connections import ConnectionRegistry
from headcount._http.handler import (
    ExchangeListener,
    HeadScreen,
    Rejected,
    Request,
    RequestHandler,
)
from headcount._http.phase import BODY, CONNECTION_LOST, HEAD, STOP, STOPPED
from headcount._http.reader import Early, Joining, RequestReader, ServerLimits
from headcount._http.wire import CHUNKED_END, INTERNAL_ERROR_BODY, JSON_HEADER, REASONS, chunk

__all__ = ["HttpServerProtocol", "ServerLimits"]

_log = logging.getLogger(__name__)


_CONNECTION = ((b"connection: keep-alive\r\n", b""), (b"connection: close\r\n",) * 2)
"""The `connection` header of a response, by [close][http11]: HTTP/1.1 keeps alive unless
told otherwise, HTTP/1.0 only when told."""
_CHUNKED = b"transfer-encoding: chunked\r\n"
_NO_BODY_STATUSES = frozenset({204, 304})
_LINGER_TIMEOUT = 2.0
"""After an error answer and our FIN, how long the client may keep sending before we close."""
_DISPATCH_TURN = 16
"""Requests of one connection dispatched per loop iteration at most: a client pipelining
requests the router answers itself (`GET /v1/models`) cannot hold the loop; the rest wait
for the next iteration."""


class HttpServerProtocol(RequestReader):
    """One client connection: parses requests, answers them in order (it is their Responder).

    Its reading is one `Phase` (`RequestReader`); the rest of its state is each about one
    thing the phase says nothing of, and is named for it: the exchange in progress
    (`_request`, `None` between exchanges, and how its response is framed), flow control
    each way (`_read_paused`, `_write_paused`), shutdown (`_draining`, which can come in
    any phase), and work left for later (`_backlog`, `_feed_scheduled`, `_continue`, and
    `_dispatching`, set while a dispatch is under way).
    """

    __slots__ = (
        "__weakref__",
        "_chunked",
        "_close_after",
        "_deadline",
        "_dispatching",
        "_draining",
        "_handler",
        "_listener",
        "_no_body",
        "_send_timer",
        "_started",
        "_timer",
        "_timer_at",
        "_write_paused",
    )

    def __init__(
        self,
        handler: RequestHandler,
        limits: ServerLimits,
        registry: ConnectionRegistry,
        loop: asyncio.AbstractEventLoop,
        on_rejected: Rejected | None = None,
        screen: HeadScreen | None = None,
    ) -> None:
        """`on_rejected` hears of each request this layer answers itself (400, 413...);
        `screen` sees each head before its body is read (None: every body is read)."""
        super().__init__(limits, registry, loop, on_rejected, screen)
        self._handler = handler
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline = 0.0
        self._send_timer: asyncio.TimerHandle | None = None
        self._dispatching = False
        self._draining = False
        self._write_paused = False
        self._listener: ExchangeListener | None = None
        self._started = False
        """Whether the response's head is out (a handler that fails then is cut off)."""
        self._chunked = False
        self._no_body = False
        self._close_after = False

    # -- connection events --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self._client = str(peer[0])
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self._registry.admit(self):
            # Over the connection limit: say so and close; this is not a request to count.
            self._stop(answers.TOO_MANY_CONNECTIONS)
            self._dispatch_pending()
            return
        self._draining = self._registry.draining
        self._arm(self._limits.keepalive_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._phase = CONNECTION_LOST[self._phase]
        self._registry.discard(self)
        self._queue.clear()
        for timer in (self._timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._send_timer = None
        if self._request is not None:
            listener = self._listener
            self._end_exchange()
            if listener is not None:
                listener.client_lost()
        self._release()

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._send_timer is None:
            self._send_timer = self._loop.call_later(
                self._limits.send_timeout, self._on_send_timeout
            )
        if self._listener is not None:
            self._listener.client_paused()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        if self._listener is not None:
            self._listener.client_resumed()
        elif self._request is None:
            self._dispatch_pending()

    # -- Responder ----------------------------------------------------------------------------

    def attach(self, listener: ExchangeListener) -> None:
        self._listener = listener
        if self._write_paused:
            listener.client_paused()

    def respond(self, status: int, header_block: bytes, body: bytes) -> None:
        transport = self._transport
        request = self._request
        if transport is None or request is None:
            return
        close = not request.keep_alive or self._draining
        head = b"HTTP/1.1 %d %s\r\n%scontent-length: %d\r\n%s\r\n" % (
            status,
            REASONS.get(status, b""),
            header_block,
            len(body),
            _CONNECTION[close][request.http11],
        )
        transport.write(head if self._no_body else head + body)
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
        request = self._request
        if transport is None or request is None:
            return
        close = not request.keep_alive or self._draining
        if status in _NO_BODY_STATUSES or status < 200:
            framing = b""
            self._no_body = True
        elif content_length is not None:
            framing = b"content-length: %d\r\n" % content_length
        elif request.http11:
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
            _CONNECTION[close][request.http11],
        )
        self._started = True
        transport.write(head + self._frame(body, complete))
        if complete:
            self._finish(close)

    def write(self, body: bytes, complete: bool) -> None:
        transport = self._transport
        if transport is None or self._request is None:
            return
        data = self._frame(body, complete)
        if len(data):
            transport.write(data)
        if complete:
            self._finish(self._close_after)

    def abort(self) -> None:
        transport = self._transport
        if transport is None or self._request is None:
            return
        self._end_exchange()
        self._close(transport)

    def _frame(self, body: bytes, complete: bool) -> bytes:
        if self._no_body:
            return b""
        if not self._chunked:
            return body
        if len(body) == 0:
            return CHUNKED_END if complete else b""
        return chunk(body, complete)

    # -- exchanges ----------------------------------------------------------------------------

    def _dispatch_pending(self) -> None:
        """Dispatch what is queued, unless an exchange runs or the client is not reading."""
        if self._request is not None or self._dispatching or self._write_paused:
            return
        queue = self._queue
        self._dispatching = True
        dispatched = 0
        try:
            while queue and self._idle() and not self._write_paused:
                transport = self._transport
                if transport is None:
                    return
                if dispatched == _DISPATCH_TURN:
                    self._loop.call_soon(self._dispatch_pending)
                    break
                item = queue.popleft()
                if isinstance(item, Request):
                    self._dispatch(item, self._handler)
                elif isinstance(item, Early):
                    self._dispatch(item.request, item.handler)
                elif isinstance(item, Joining):
                    joined = item.joined
                    if not joined.done():
                        queue.appendleft(item)
                        break
                    if joined.cancelled() or joined.exception() is not None:
                        # Out of memory, most likely: say so and close.
                        self._phase = STOP[self._phase]
                        self._linger(transport, self._refusal(answers.OVERLOADED, item.request))
                        return
                    item.request.body = joined.result()
                    self._dispatch(item.request, self._handler)
                else:
                    self._linger(transport, item)
                    return
                dispatched += 1
        finally:
            self._dispatching = False
        transport = self._transport
        if transport is None or not self._idle() or self._write_paused or queue:
            return
        if self._read_paused and self._phase < STOPPED:
            self._read_paused = False
            if self._backlog is None:
                transport.resume_reading()
        if self._backlog is not None:
            self._schedule_feed()
        elif self._continue:
            self._continue = False
            transport.write(answers.CONTINUE)

    def _idle(self) -> bool:
        """No exchange runs. A method, not the attribute: a dispatch may start or end one, and
        mypyc, which compiles this module, would check a second read of `_request` against
        the type the first one narrowed it to."""
        return self._request is None

    def _dispatch(self, request: Request, handler: RequestHandler) -> None:
        self._request = request
        self._listener = None
        self._started = False
        self._chunked = False
        self._no_body = request.is_head
        self._registry.active += 1
        try:
            handler(request, self)
        except Exception:
            _log.exception("request handler failed")
            if self._request is None:
                return
            if self._started:
                self.abort()
            else:
                self.respond(500, JSON_HEADER, INTERNAL_ERROR_BODY)

    def _finish(self, close: bool) -> None:
        self._end_exchange()
        transport = self._transport
        if transport is None:
            return
        if close or self._draining:
            if self._phase is STOPPED:  # what the client sent next is unread: linger
                self._queue.clear()
                self._linger(transport, b"")
            else:
                self._close(transport)
            return
        # The next request (or the one partly here) gets a fresh deadline.
        limits = self._limits
        self._arm(limits.header_timeout if self._phase is HEAD else limits.keepalive_timeout)
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
            self._close(transport)
            return
        transport.write_eof()
        if self._read_paused or self._backlog is not None:
            self._read_paused = False
            self._backlog = None
            transport.resume_reading()
        self._arm(_LINGER_TIMEOUT)

    def _end_exchange(self) -> None:
        request = self._request
        if request is not None:
            size = len(request.body)
            if size:
                self._registry.bodies.give(size)
                self._held -= size
        self._request = None
        self._listener = None
        self._registry.exchange_done()

    def _close(self, transport: asyncio.Transport) -> None:
        """Close after what is buffered is sent, but give a client that reads none of it
        no more than `send_timeout` (a close waits for the buffer to drain)."""
        transport.close()
        if self._send_timer is None and transport.get_write_buffer_size():
            self._send_timer = self._loop.call_later(
                self._limits.send_timeout, self._on_send_timeout
            )

    def _on_send_timeout(self) -> None:
        self._send_timer = None
        if self._transport is not None:
            self._transport.abort()  # connection_lost follows: the exchange hears client_lost

    def drain(self) -> None:
        """Answer what is in progress with `connection: close`; close now if nothing is."""
        self._draining = True
        transport = self._transport
        if (
            self._request is None
            and self._phase is not HEAD
            and self._phase is not BODY
            and not self._queue
            and transport
        ):
            self._close(transport)

    def close(self) -> None:
        """Drop the connection now, whatever it is doing."""
        if self._transport is not None:
            self._transport.abort()

    # -- deadlines: one timer handle; the deadline moves, the timer is re-armed lazily --------

    def _arm(self, seconds: float) -> None:
        """The connection must make its next step within `seconds`.

        A later deadline only moves `_deadline` (the timer, when it fires early, re-arms);
        an earlier one re-schedules the timer.
        """
        deadline = self._loop.time() + seconds
        self._deadline = deadline
        timer = self._timer
        if timer is None or self._timer_at > deadline:
            if timer is not None:
                timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or self._request is not None:
            return  # re-armed when the exchange finishes
        deadline = self._deadline
        if self._loop.time() < deadline:
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)
        elif self._phase is HEAD or self._phase is BODY:
            self._stop(answers.REQUEST_TIMEOUT)  # a request began and did not arrive in time
            self._dispatch_pending()
        else:
            self._close(transport)  # idle, or done lingering
