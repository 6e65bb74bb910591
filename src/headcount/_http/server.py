"""HTTP/1.1 for clients: one callback-driven Protocol per connection, no Task per request.

One class holds one connection's whole state machine (parsing, ordering,
framing, flow control, deadlines), kept together so the per-request path reads
in one place (hence its length); the contract with handlers is in `handler.py`,
the canned answers in `answers.py`.

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
  reading chunks); 503 `overloaded` when the body does not fit in the server's
  shared `BodyBudget`, and 503 `too_many_connections` to a connection over the
  registry's limit; all in the OpenAI shape, then the connection closes;
- HEAD answered without a body; TCP_NODELAY on every connection (without it a
  stream on a reused connection waits ~40 ms for its first chunk: Nagle plus
  delayed ACK).

Memory: a body is held as few objects (`body.py`: its first piece as it came,
then pieces of 16 KiB or more), never one per chunk, and counted against the
budget from arrival (a chunked one in 64 KiB steps) until its exchange ends. A
connection that ends releases everything at once: its budget, its buffers, and
the protocol <-> parser reference cycle, so a dropped upload is freed without
waiting for the cyclic garbage collector.

The loop: a read over 16 KiB is parsed a slice per loop iteration (reading
paused meanwhile), so no read costs more than one slice's parsing, and a body
from 1 MiB is joined into one `bytes` in a thread (`body.py`). A chunked body
past 16 KiB in chunks of a few bytes is refused (`_TINY_PIECES_FROM`), so one
client costs at most a few slices of that worst-case parsing.

Flow control: when the client's socket buffer fills (`pause_writing`) the
exchange's `ExchangeListener` is told, so it can stop reading upstream, and no
further pipelined request is dispatched until the client reads
(`resume_writing`): a client that never reads cannot make the router produce
answers it will not take. A client that goes away mid-exchange (EOF or reset)
is reported once, through `ExchangeListener.client_lost`.
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

from headcount._http import answers
from headcount._http.body import JOIN_OFF_LOOP, BodyPieces
from headcount._http.connections import ConnectionRegistry
from headcount._http.handler import ExchangeListener, Request, RequestHandler
from headcount._http.wire import CHUNKED_END, INTERNAL_ERROR_BODY, JSON_HEADER, REASONS

__all__ = ["HttpServerProtocol", "ServerLimits"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds on what one client connection may send and how long it may take.

    The values and the reasons for them are in `headcount.config.ProxySettings`.
    """

    max_header_size: int
    """Request line plus header fields; more gets 431."""
    max_body_size: int
    """More gets 413; bodies are held whole in memory before dispatch."""
    keepalive_timeout: float
    """Idle client connections close after this; a request's body must arrive within it."""
    max_pipeline: int
    """Requests parsed ahead of the one being answered before reading pauses."""
    header_timeout: float = 30.0
    """A request head must arrive whole within this of its first read (slowloris)."""
    send_timeout: float = 30.0
    """A client that takes nothing of a pending response for this long is disconnected."""


_CLOSE_AFTER = b""
"""Queue marker: close once everything before it is answered (nothing more to say)."""
_CONNECTION_CLOSE = b"connection: close\r\n"
_CONNECTION_KEEP_ALIVE = b"connection: keep-alive\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"
_NO_BODY_STATUSES = frozenset({204, 304})
_LINGER_TIMEOUT = 2.0
"""After an error answer and our FIN, how long the client may keep sending before we close."""
_DISCARD_MAX = 1024 * 1024
"""What is read and dropped after the router stopped parsing; then reading stops, and the
rest waits in the kernel until the close (an uploader refused early would otherwise have
the router read its whole body: 25 at once were 775 MiB)."""
_FEED_MAX = 16 * 1024
"""Parsed per loop iteration at most: a larger read waits its turn in slices."""
_FEED_PIPELINED = 2 * 1024
"""The slice for a connection that pipelines (a request arrived while another was queued or
in progress): 16 KiB of pipelined `GET`s is hundreds of requests parsed in one go (4 such clients
held the loop 24 ms), 2 KiB a few dozen. HTTP clients rarely pipeline, and a request body,
however large, is still read 16 KiB at a time on any other connection."""
_DISPATCH_TURN = 16
"""Requests of one connection dispatched per loop iteration at most: a client pipelining
requests the router answers itself (`GET /v1/models`) cannot hold the loop; the rest wait
for the next iteration."""
_RESERVE_STEP = 64 * 1024
"""A chunked body takes from the body budget this much at a time (what it may hold unused)."""
_TINY_PIECES_FROM, _TINY_PIECE_MEAN = 256, 64
"""A body of over 256 pieces averaging under 64 bytes is refused (400): each piece costs a
parser callback (~1 µs), so 2-byte chunks make a 31 MiB upload 16 million calls, and a few
such clients stall every other. Counted in pieces, the refusal comes within one read's parse
(256 callbacks), so 25 such uploads starting at once cost the loop a few milliseconds. A
client streams a body in pieces of kilobytes; a body of up to 256 pieces may come in pieces
of any size."""
_HEAD, _BODY = 1, 2
"""Which deadline a partly received request is under (`_armed`)."""


class _Rejected(Exception):
    """Raised from a parser callback to stop parsing; the response is in `_reject`."""


class _Joining:
    """A request whose large body is being joined in a thread; it waits its turn in the queue."""

    __slots__ = ("joined", "request")

    def __init__(self, request: Request, joined: asyncio.Future[bytes]) -> None:
        self.request = request
        self.joined = joined


class HttpServerProtocol(asyncio.Protocol):
    """One client connection: parses requests, answers them in order (it is their Responder)."""

    __slots__ = (
        "__weakref__",
        "_active",
        "_armed",
        "_backlog",
        "_body",
        "_body_size",
        "_chunked",
        "_close_after",
        "_content_length",
        "_continue",
        "_deadline",
        "_discarded",
        "_dispatching",
        "_draining",
        "_expect",
        "_feed_max",
        "_feed_scheduled",
        "_handler",
        "_head_began",
        "_head_bytes",
        "_head_raw",
        "_headers",
        "_held",
        "_hosts",
        "_http11",
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
        "_pieces",
        "_queue",
        "_read_body",
        "_read_paused",
        "_registry",
        "_reject",
        "_request",
        "_reserved",
        "_send_timer",
        "_started",
        "_stopped",
        "_timer",
        "_timer_at",
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
        self._queue: deque[Request | _Joining | bytes] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline = 0.0
        self._send_timer: asyncio.TimerHandle | None = None
        self._active = False
        self._dispatching = False
        self._draining = False
        self._stopped = False
        self._discarded = 0
        self._read_paused = False
        self._write_paused = False
        self._in_message = False
        self._in_head = False
        self._head_began = False
        self._read_body = 0
        self._backlog: memoryview | None = None
        """What a large read left to parse (reading is paused while there is some)."""
        self._feed_max = _FEED_MAX
        """Bytes parsed per loop iteration at most on this connection (less once it pipelines)."""
        self._feed_scheduled = False
        self._continue = False
        self._reject: bytes | None = None
        self._request: Request | None = None
        self._listener: ExchangeListener | None = None
        self._started = False
        self._chunked = False
        self._no_body = False
        self._close_after = False
        self._held = 0
        """Body bytes this connection holds of the registry's budget (all its requests)."""
        self._pieces = BodyPieces()
        """A body that came in several reads (reused across requests, emptied after each)."""
        self._method = b""
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body = b""
        self._body_size = 0
        self._hosts = 0
        self._armed = 0
        self._expect: bytes | None = None
        self._reset_message()

    # -- connection events --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self._registry.admit(self):
            # Over the connection limit: say so and close; this is not a request to count.
            self._stopped = True
            self._queue.append(answers.TOO_MANY_CONNECTIONS)
            self._dispatch_pending()
            return
        self._draining = self._registry.draining
        self._arm(self._limits.keepalive_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._stopped = True
        self._registry.discard(self)
        self._queue.clear()
        for timer in (self._timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._send_timer = None
        if self._active:
            listener = self._listener
            self._end_exchange()
            if listener is not None:
                listener.client_lost()
        # Release at once what the connection held: its share of the body budget, its
        # buffers, and the parser, whose callbacks are bound methods of this protocol (a
        # reference cycle that would otherwise keep a dropped upload until the cyclic GC).
        self._registry.bodies.give(self._held)
        self._held = 0
        self._body = b""
        self._pieces.clear()
        self._headers = []
        self._backlog = None
        del self._parser

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
        elif not self._active:
            self._dispatch_pending()

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            self._discarded += len(data)
            if self._discarded > _DISCARD_MAX and self._transport is not None:
                self._transport.pause_reading()
            return
        if len(data) > self._feed_max or self._backlog is not None:
            self._queue_input(data)
            return
        self._feed(data)

    def _queue_input(self, data: bytes) -> None:
        """A large read is parsed a slice per loop iteration, so that no read costs the loop
        more than one slice's parsing (a body in 2-byte chunks is ~30 ns a byte), and not at
        all while the pipeline is full; reading pauses until it is all parsed."""
        backlog = self._backlog
        self._backlog = memoryview(bytes(backlog) + data if backlog is not None else data)
        if self._transport is not None:
            self._transport.pause_reading()
        self._feed_backlog()

    def _feed_backlog(self) -> None:
        self._feed_scheduled = False
        backlog = self._backlog
        transport = self._transport
        if backlog is None or transport is None or self._stopped:
            self._backlog = None
            return
        step = self._feed_max
        rest = backlog[step:]
        self._backlog = rest if len(rest) else None
        self._feed(backlog[:step])
        if self._backlog is None:
            if not self._read_paused and not self._stopped and self._transport is not None:
                transport.resume_reading()
        elif len(self._queue) < self._limits.max_pipeline:
            self._schedule_feed()
        # else: the queue is full; `_dispatch_pending` feeds on once it drains

    def _schedule_feed(self) -> None:
        if not self._feed_scheduled and not self._stopped:
            self._feed_scheduled = True
            self._loop.call_soon(self._feed_backlog)

    def _feed(self, data: bytes | memoryview) -> None:
        # Body bytes this read brings to requests it completes (a request's body so far
        # before it is not this read's): what `_partial` subtracts from a head's tail.
        self._read_body = -self._body_size if self._in_message else 0
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The bytes after an upgrade request are not HTTP/1.1: answer it, then close.
            self._stop(_CLOSE_AFTER)
        except httptools.HttpParserError:
            self._stop(self._reject or answers.BAD_REQUEST)
        else:
            if self._in_message:
                self._partial(data)
        self._dispatch_pending()

    def _partial(self, data: bytes | memoryview) -> None:
        """A read ended inside a request: bound its head, and put it under its deadline.

        httptools joins a header line split over reads before calling on_header, so
        the callbacks do not see what it accumulates: that is bounded here from the raw
        bytes of the head alone (up to one read over). A read that ends inside the head
        it began holds, of that head's unfinished line, what follows its last LF, less
        any body bytes (a previous request's) among them; a read that begins and ends
        inside one head is all that head's. Nothing else counts, so pipelined or split
        requests are never charged for each other's bytes.
        """
        if self._in_head:
            if self._head_began:
                self._head_began = False
                tail = len(data) - bytes(data).rfind(b"\n") - 1
                self._head_raw = max(0, tail - self._read_body)
            else:
                self._head_raw += len(data)
            if self._head_raw > 2 * self._limits.max_header_size:
                self._stop(answers.HEADERS_TOO_LARGE)
                return
            if self._armed != _HEAD:
                self._armed = _HEAD
                if not self._active:
                    self._arm(self._limits.header_timeout)
        elif self._armed != _BODY:
            self._armed = _BODY
            if not self._active:
                self._arm(self._limits.keepalive_timeout)

    # -- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset_message()
        self._in_message = True
        self._in_head = True
        self._head_began = True

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self._headers.append((name, value))
        self._head_bytes += len(name) + len(value) + 4  # `_count_head` inlined: once per header
        if self._head_bytes > self._limits.max_header_size:
            self._fail(answers.HEADERS_TOO_LARGE)
        if name == b"content-length":
            self._content_length = int(value)
        elif name == b"host":
            self._hosts += 1
        elif name == b"expect":
            self._expect = value

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        self._method = parser.get_method()
        version = parser.get_http_version()
        if version == "1.1":
            self._http11 = True
        elif version == "1.0":
            self._http11 = False
        elif version == "2.0":
            self._fail(answers.VERSION_NOT_SUPPORTED)
        else:
            self._fail(answers.BAD_VERSION)  # HTTP/0.9: a request line without a version
        if self._hosts != 1 and (self._hosts or self._http11):
            self._fail(answers.BAD_HOST)
        self._keep_alive = parser.should_keep_alive()
        length = self._content_length
        if length:
            if length > self._limits.max_body_size:
                self._fail(answers.BODY_TOO_LARGE)
            if not self._registry.bodies.take(length):
                self._fail(answers.OVERLOADED)
            self._held += length
            self._reserved = length
        if self._expect is not None and self._http11:
            if self._expect.lower() != b"100-continue":
                self._fail(answers.EXPECTATION_FAILED)
            self._continue = True
            if not self._active and not self._queue and self._transport is not None:
                self._transport.write(answers.CONTINUE)
                self._continue = False

    def on_body(self, body: bytes) -> None:
        size = len(body)
        total = self._body_size + size
        self._body_size = total
        if total > self._reserved:
            self._reserve(total)
        if total == size:
            self._body = body  # the first piece, kept as it came (most bodies have one)
            return
        pieces = self._pieces
        if self._body:
            pieces.add(self._body)
            self._body = b""
        pieces.add(body)
        count = pieces.count
        if count > _TINY_PIECES_FROM and total < count * _TINY_PIECE_MEAN:
            self._fail(answers.CHUNKS_TOO_SMALL)

    def _reserve(self, total: int) -> None:
        """A chunked body outgrew what it holds of the budget: take more, in steps, so
        that a body sent in tiny chunks does not cost a reservation per chunk."""
        limit = self._limits.max_body_size
        if total > limit:
            self._fail(answers.BODY_TOO_LARGE)
        step = min(max(total - self._reserved, _RESERVE_STEP), limit - self._reserved)
        if not self._registry.bodies.take(step):
            self._fail(answers.OVERLOADED)
        self._held += step
        self._reserved += step

    def on_message_complete(self) -> None:
        if self._queue or self._active:
            self._feed_max = _FEED_PIPELINED
        self._read_body += self._body_size
        unused = self._reserved - self._body_size
        if unused:  # the last step of a chunked body's reservation
            self._registry.bodies.give(unused)
            self._held -= unused
        request = Request(
            self._method, self._url, self._headers, self._body, self._http11, self._keep_alive
        )
        self._body = b""
        self._in_message = False
        self._continue = False
        pieces = self._pieces
        if not pieces.count:
            self._queue.append(request)
        elif self._body_size < JOIN_OFF_LOOP:
            request.body = b"".join(pieces.take())
            self._queue.append(request)
        else:  # a large copy: in a thread, dispatched in its turn once joined
            joined = self._loop.run_in_executor(None, b"".join, pieces.take())
            joined.add_done_callback(self._joined)
            self._queue.append(_Joining(request, joined))
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
        self._close(transport)

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
        """Dispatch what is queued, unless an exchange runs or the client is not reading."""
        if self._active or self._dispatching or self._write_paused:
            return
        queue = self._queue
        self._dispatching = True
        dispatched = 0
        try:
            while queue and not self._active and not self._write_paused:
                transport = self._transport
                if transport is None:
                    return
                if dispatched == _DISPATCH_TURN:
                    self._loop.call_soon(self._dispatch_pending)
                    break
                item = queue.popleft()
                if isinstance(item, bytes):
                    self._linger(transport, item)
                    return
                if isinstance(item, _Joining):
                    joined = item.joined
                    if not joined.done():
                        queue.appendleft(item)
                        break
                    if joined.cancelled() or joined.exception() is not None:
                        self._stopped = True  # out of memory, most likely: say so and close
                        self._linger(transport, answers.OVERLOADED)
                        return
                    item.request.body = joined.result()
                    item = item.request
                self._dispatch(item)
                dispatched += 1
        finally:
            self._dispatching = False
        transport = self._transport
        if transport is None or self._active or self._write_paused or queue:
            return
        if self._read_paused and not self._stopped:
            self._read_paused = False
            if self._backlog is None:
                transport.resume_reading()
        if self._backlog is not None:
            self._schedule_feed()
        elif self._continue:
            self._continue = False
            transport.write(answers.CONTINUE)

    def _joined(self, _future: asyncio.Future[bytes]) -> None:
        if self._transport is not None:
            self._dispatch_pending()

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
        transport = self._transport
        if transport is None:
            return
        if close or self._draining:
            self._close(transport)
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
        self._active = False
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
        if not self._active and not self._in_message and not self._queue and transport:
            self._close(transport)

    def close(self) -> None:
        """Drop the connection now, whatever it is doing."""
        if self._transport is not None:
            self._transport.abort()

    # -- parsing state ------------------------------------------------------------------------

    def _reset_message(self) -> None:
        self._method = b""
        self._url = b""
        self._headers = []
        self._body = b""
        self._body_size = 0
        self._content_length = 0
        self._reserved = 0
        self._hosts = 0
        self._expect = None
        self._head_bytes: int = 0
        self._head_raw = 0
        self._armed = 0
        self._http11 = True
        self._keep_alive = True

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._limits.max_header_size:
            self._fail(answers.HEADERS_TOO_LARGE)

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

    # -- deadlines: one timer handle; the deadline moves, the timer is re-armed lazily --------

    def _arm_idle(self) -> None:
        """After an exchange: the next request (or the one partly here) gets a fresh deadline."""
        limits = self._limits
        self._arm(limits.header_timeout if self._in_head else limits.keepalive_timeout)

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
        if transport is None or self._active:
            return  # re-armed when the exchange finishes
        deadline = self._deadline
        if self._loop.time() < deadline:
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)
        elif self._in_message:
            self._stop(answers.REQUEST_TIMEOUT)  # a request began and did not arrive in time
            self._dispatch_pending()
        else:
            self._close(transport)  # idle, or done lingering
