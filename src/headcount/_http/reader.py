"""Reading a client connection: bytes in, whole requests out, under the server's limits.

The reading half of `server.HttpServerProtocol`, which subclasses `RequestReader`:
one object, so that every parser callback reaches the connection's state directly
(the callbacks run several times per request). This half parses with httptools,
enforces what a client may send (the head, the body, the time each may take from
the read that began it), shows each head to the connection's `HeadScreen` before
reading its body (a request the screen answers is queued from its head, and what
follows it is never read), and queues each whole request, or the answer that
refuses it, for the answering half to dispatch in order; it hears from that half only
whether an exchange is in progress (`_request`), and asks it to dispatch and to
set a deadline (`_dispatch_pending`, `_arm`).

Where the connection is in reading is one `Phase` (`phase.py`), moved only through
its transition table. What is known of the request being read is one `_Message`,
a fresh one per request. The head is counted as `head.py` counts any head.

Memory: a body is held as few objects (`body.py`: its first piece as it came,
then pieces of up to 1 MiB), never one per chunk, and counted against the
budget as it arrives (never as declared; a chunked one in 64 KiB steps) until
its exchange ends. A connection that ends releases everything at once: its
budget, its buffers, and the protocol <-> parser reference cycle, so a dropped
upload is freed without waiting for the cyclic garbage collector.

The loop: a read over 16 KiB is parsed a slice per loop iteration (reading
paused meanwhile), so no read costs more than one slice's parsing, and a body
from 1 MiB is joined into one `bytes` in a thread (`body.py`). A body of many
chunks of a few bytes each is refused (`_TINY_CHUNKS_FROM`), so one client
costs at most a few slices of that worst-case parsing.

Over 450 lines on purpose: every parser callback and the limits each enforces read in
one place, as the parser calls them.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import NoReturn

import httptools

from headcount._http import answers
from headcount._http.body import JOIN_OFF_LOOP, BodyPieces
from headcount._http.connections import ConnectionRegistry
from headcount._http.handler import ConnectionNote, HeadScreen, Rejected, Request, RequestHandler
from headcount._http.head import Head, HeadReader
from headcount._http.phase import (
    BODY,
    HEAD,
    HEADERS_COMPLETE,
    IDLE,
    MESSAGE_BEGIN,
    MESSAGE_COMPLETE,
    STOP,
    STOPPED,
)

__all__ = ["Early", "Joining", "RequestReader", "ServerLimits"]


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
_DISCARD_MAX = 1024 * 1024
"""What is read and dropped after the router stopped parsing; then reading stops, and the
rest waits in the kernel until the close (an uploader refused early would otherwise have
the router read its whole body, however large)."""
_FEED_MAX = 16 * 1024
"""Parsed per loop iteration at most: a larger read waits its turn in slices."""
_FEED_PIPELINED = 2 * 1024
"""The slice for a connection that pipelines (a request arrived while another was queued or
in progress): 16 KiB of pipelined `GET`s is hundreds of requests parsed in one go, 2 KiB a
few dozen. HTTP clients rarely pipeline, and a request body, however large, is still read
16 KiB at a time on any other connection."""
_RESERVE_STEP = 64 * 1024
"""A chunked body takes from the body budget this much at a time (what it may hold unused)."""
_TINY_CHUNKS_FROM, _TINY_CHUNK_MEAN = 256, 64
"""A body of over 256 chunks averaging under 64 bytes is refused (400): each chunk costs
parser callbacks, so a large upload in 2-byte chunks is millions of calls, and a few such
clients stall every other. Counted in chunks, the refusal comes within one read's parse
(a few hundred callbacks), so even many such uploads starting at once cost the loop little.
A client streams a body in chunks of kilobytes; a body of up to 256 chunks may come in
chunks of any size. Chunks, not body callbacks: a read that ends inside a chunk gives it two
callbacks, and how a client's bytes fall into reads must not decide its answer."""
_NOTED = (b"host", b"expect")
"""Besides Content-Length, the request headers this layer acts on (`_note`)."""


class _Rejected(Exception):
    """Raised from a parser callback to stop parsing; the response is in `_reject`."""


class _Message(Head):
    """What this layer knows of the request being read: a fresh one per request.

    It stays the connection's `_message` after the request is queued, until the next one
    begins, so it lets go of the body as the request is queued (the request has it).
    """

    __slots__ = (
        "answer",
        "body",
        "body_size",
        "chunks",
        "expect",
        "hosts",
        "http11",
        "request",
        "reserved",
        "url",
    )

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self.size = 0
        self.raw = 0
        self.url = b""
        self.http11 = True
        self.request: Request | None = None
        """Made when the head is whole."""
        self.answer: RequestHandler | None = None
        """What answers the request from its head alone (the screen's say), if anything."""
        self.hosts = 0
        """Host headers seen: HTTP/1.1 needs exactly one, HTTP/1.0 at most one."""
        self.expect: bytes | None = None
        self.body = b""
        """The body's first piece as it came (most bodies have one); later ones go to
        the connection's `BodyPieces`."""
        self.body_size = 0
        self.chunks = 0
        self.reserved = 0
        """What the body holds of the body budget: what arrived of it (in steps, for a
        chunked one)."""


class Early:
    """A request answered from its head alone, by `handler` (the screen's say)."""

    __slots__ = ("handler", "request")

    def __init__(self, request: Request, handler: RequestHandler) -> None:
        self.request = request
        self.handler = handler


class Joining:
    """A request whose large body is being joined in a thread; it waits its turn in the queue."""

    __slots__ = ("joined", "request")

    def __init__(self, request: Request, joined: asyncio.Future[bytes]) -> None:
        self.request = request
        self.joined = joined


class RequestReader(HeadReader[_Message]):
    """The reading half of a client connection; `HttpServerProtocol` is the whole of it."""

    __slots__ = (
        "_backlog",
        "_client",
        "_connection_note",
        "_continue",
        "_discarded",
        "_feed_max",
        "_feed_scheduled",
        "_held",
        "_limits",
        "_loop",
        "_on_rejected",
        "_parser",
        "_phase",
        "_pieces",
        "_queue",
        "_read_body",
        "_read_paused",
        "_registry",
        "_reject",
        "_request",
        "_screen",
        "_transport",
    )
    __deletable__ = ("_parser",)
    """What `_release` deletes (mypyc, which compiles this module, must be told)."""

    def __init__(
        self,
        limits: ServerLimits,
        registry: ConnectionRegistry,
        loop: asyncio.AbstractEventLoop,
        on_rejected: Rejected | None,
        screen: HeadScreen | None,
    ) -> None:
        super().__init__(_Message(), limits.max_header_size, _NOTED)
        self._limits = limits
        self._registry = registry
        self._loop = loop
        self._on_rejected = on_rejected
        self._screen = screen
        self._connection_note = ConnectionNote()
        self._parser = httptools.HttpRequestParser(self)
        self._phase = IDLE
        self._transport: asyncio.Transport | None = None
        self._client = ""
        """The peer's address (`Request.client`), set when the connection is made."""
        self._queue: deque[Request | Early | Joining | bytes] = deque()
        """What is read and not yet dispatched, in order: requests, and the answer that
        ends the connection (`_CLOSE_AFTER` when there is nothing to say)."""
        self._request: Request | None = None
        """The request being answered (the answering half's): set from dispatch until its
        response is complete. Reading runs beside it (pipelining)."""
        self._discarded = 0
        self._read_paused = False
        self._read_body = 0
        self._backlog: memoryview | None = None
        """What a large read left to parse (reading is paused while there is some)."""
        self._feed_max = _FEED_MAX
        """Bytes parsed per loop iteration at most on this connection (less once it pipelines)."""
        self._feed_scheduled = False
        self._continue = False
        """A `100 Continue` is owed to the request being read, once those before it are
        answered; it is not owed any more once that request is whole."""
        self._reject: bytes | None = None
        self._held = 0
        """Body bytes this connection holds of the registry's budget (all its requests)."""
        self._pieces = BodyPieces()
        """A body that came in several reads (reused across requests, emptied after each)."""

    @abstractmethod
    def _dispatch_pending(self) -> None:
        """Dispatch what is queued, as far as the answering half can now."""

    @abstractmethod
    def _arm(self, seconds: float) -> None:
        """The connection must make its next step within `seconds`."""

    def _release(self) -> None:
        """The connection is gone: release at once what reading held, its share of the body
        budget, its buffers, and the parser, whose callbacks are bound methods of this
        protocol (a reference cycle that would otherwise keep a dropped upload until the
        cyclic GC)."""
        self._registry.bodies.give(self._held)
        self._held = 0
        self._message = _Message()
        self._pieces.clear()
        self._backlog = None
        del self._parser

    # -- reading ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._phase >= STOPPED:
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
        more than one slice's parsing (a body in tiny chunks is the costliest to parse), and
        not at all while the pipeline is full; reading pauses until it is all parsed."""
        backlog = self._backlog
        self._backlog = memoryview(bytes(backlog) + data if backlog is not None else data)
        if self._transport is not None:
            self._transport.pause_reading()
        self._feed_backlog()

    def _feed_backlog(self) -> None:
        self._feed_scheduled = False
        backlog = self._backlog
        transport = self._transport
        if backlog is None or transport is None or self._phase >= STOPPED:
            self._backlog = None
            return
        step = self._feed_max
        rest = backlog[step:]
        self._backlog = rest if len(rest) else None
        self._feed(backlog[:step])
        if self._backlog is None:
            if not self._read_paused and self._phase < STOPPED and self._transport is not None:
                transport.resume_reading()
        elif len(self._queue) < self._limits.max_pipeline:
            self._schedule_feed()
        # else: the queue is full; `_dispatch_pending` feeds on once it drains

    def _schedule_feed(self) -> None:
        if not self._feed_scheduled and self._phase < STOPPED:
            self._feed_scheduled = True
            self._loop.call_soon(self._feed_backlog)

    def _feed(self, data: bytes | memoryview) -> None:
        message = self._message
        phase = self._phase
        # Body bytes this read brings to requests it completes (a request's body so far
        # before it is not this read's): what `_partial` subtracts from a head's tail.
        self._read_body = -message.body_size if phase is BODY else 0
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The bytes after an upgrade request are not HTTP/1.1: answer it, then close.
            self._stop(_CLOSE_AFTER)
        except httptools.HttpParserError:
            reject = self._reject
            self._stop(answers.BAD_REQUEST if reject is None else reject)
        else:
            if self._phase is HEAD or self._phase is BODY:
                self._partial(data, self._message is not message or self._phase is not phase)
        self._dispatch_pending()

    def _partial(self, data: bytes | memoryview, entered: bool) -> None:
        """A read ended inside a request: bound its head, and put it under its deadline.

        `entered`: this read took the request into the phase it is in (began its head, or
        ended its head), so the phase's deadline runs from this read on.

        httptools joins a header line split over reads before calling on_header, so the
        callbacks do not see what it accumulates: that is bounded here from the raw bytes
        of the head alone (up to one read over). A read that ends inside the head it began
        holds, of that head's unfinished line, what follows its last LF, less any body
        bytes (a previous request's) among them; a read that begins and ends inside one
        head is all that head's. Nothing else counts, so pipelined or split requests are
        never charged for each other's bytes.
        """
        if self._phase is HEAD:
            if entered:
                tail = len(data) - bytes(data).rfind(b"\n") - 1
                size = max(0, tail - self._read_body)
            else:
                size = len(data)
            if self._count_raw(size):
                self._stop(answers.HEADERS_TOO_LARGE)
                return
            if entered and self._request is None:
                self._arm(self._limits.header_timeout)
        elif entered and self._request is None:
            self._arm(self._limits.keepalive_timeout)

    # -- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._phase = MESSAGE_BEGIN[self._phase]
        self._message = _Message()

    def on_url(self, url: bytes) -> None:
        self._message.url += url
        self._count_head(len(url))

    def on_headers_complete(self) -> None:
        self._phase = HEADERS_COMPLETE[self._phase]
        message = self._message
        parser = self._parser
        version = parser.get_http_version()
        if version == "1.1":
            message.http11 = True
        elif version == "1.0":
            message.http11 = False
        elif version == "2.0":
            self._fail(answers.VERSION_NOT_SUPPORTED)
        else:
            self._fail(answers.BAD_VERSION)  # HTTP/0.9: a request line without a version
        if message.hosts != 1 and (message.hosts or message.http11):
            self._fail(answers.BAD_HOST)
        request = Request(
            parser.get_method(),
            message.url,
            message.headers,
            b"",
            message.http11,
            parser.should_keep_alive(),
            self._client,
        )
        request.note = self._connection_note
        message.request = request
        length = message.content_length
        if self._screen is not None:
            answer = self._screen(request)
            if answer is not None:
                self._answer_from_head(request, answer)
        if length and length > self._limits.max_body_size:
            self._fail(answers.body_too_large(self._limits.max_body_size))
        if message.expect is not None and message.http11:
            if message.expect.lower() != b"100-continue":
                self._fail(answers.EXPECTATION_FAILED)
            self._continue = True
            if self._request is None and not self._queue and self._transport is not None:
                self._transport.write(answers.CONTINUE)
                self._continue = False

    def _answer_from_head(self, request: Request, answer: RequestHandler) -> None:
        """The screen answers `request` from its head: a request with no body is queued
        as any other once whole; one with a body now, with `connection: close`, and the
        connection reads no further (its body is never read, held, or parsed)."""
        message = self._message
        length = message.content_length
        if length == 0 or (
            length is None and all(name != b"transfer-encoding" for name, _ in message.headers)
        ):
            message.answer = answer
            return
        request.keep_alive = False
        self._queue.append(Early(request, answer))
        self._fail(_CLOSE_AFTER)

    def on_body(self, body: bytes) -> None:
        message = self._message
        size = len(body)
        total = message.body_size + size
        message.body_size = total
        if total > message.reserved:
            self._reserve(total)
        if total == size:
            message.body = body  # the first piece, kept as it came (most bodies have one)
            return
        pieces = self._pieces
        if message.body:
            pieces.add(message.body)
            message.body = b""
        pieces.add(body)
        chunks = message.chunks
        if chunks > _TINY_CHUNKS_FROM and total < chunks * _TINY_CHUNK_MEAN:
            self._fail(answers.CHUNKS_TOO_SMALL)

    def on_chunk_header(self) -> None:
        self._message.chunks += 1

    def _reserve(self, total: int) -> None:
        """The body outgrew what it holds of the budget: take what arrived, never what was
        declared (a Content-Length that never arrives holds nothing). A chunked body takes
        steps, so that one sent in tiny chunks does not cost a reservation per chunk."""
        message = self._message
        if message.content_length is not None:
            step = total - message.reserved
        else:
            limit = self._limits.max_body_size
            if total > limit:
                self._fail(answers.body_too_large(self._limits.max_body_size))
            step = min(max(total - message.reserved, _RESERVE_STEP), limit - message.reserved)
        if not self._registry.bodies.take(step):
            self._fail(answers.OVERLOADED)
        self._held += step
        message.reserved += step

    def on_message_complete(self) -> None:
        self._phase = MESSAGE_COMPLETE[self._phase]
        message = self._message
        queue = self._queue
        if queue or self._request is not None:
            self._feed_max = _FEED_PIPELINED
        self._read_body += message.body_size
        unused = message.reserved - message.body_size
        if unused:  # the last step of a chunked body's reservation
            self._registry.bodies.give(unused)
            self._held -= unused
        request = message.request
        assert request is not None  # made when the head was whole
        if message.answer is not None:  # no body: nothing to join
            queue.append(Early(request, message.answer))
            message.answer = None
        elif not self._pieces.count:
            request.body = message.body
            queue.append(request)
        elif message.body_size < JOIN_OFF_LOOP:
            request.body = b"".join(self._pieces.take())
            queue.append(request)
        else:  # a large copy: in a thread, dispatched in its turn once joined
            joined = self._loop.run_in_executor(None, b"".join, self._pieces.take())
            joined.add_done_callback(self._joined)
            queue.append(Joining(request, joined))
        message.body = b""
        message.request = None
        self._continue = False
        if len(queue) >= self._limits.max_pipeline and not self._read_paused:
            self._read_paused = True
            if self._transport is not None:
                self._transport.pause_reading()

    def _joined(self, _future: asyncio.Future[bytes]) -> None:
        if self._transport is not None:
            self._dispatch_pending()

    def _note(self, name: bytes, value: bytes) -> None:
        if name == b"host":
            self._message.hosts += 1
        else:
            self._message.expect = value

    def _head_too_large(self) -> NoReturn:
        self._fail(answers.HEADERS_TOO_LARGE)

    # -- stopping -----------------------------------------------------------------------------

    def _fail(self, response: bytes) -> NoReturn:
        self._reject = response
        raise _Rejected

    def _stop(self, response: bytes) -> None:
        """Parse nothing more: answer what came before, then `response`, then close."""
        if response:
            response = self._refusal(response, self._message.request)
        self._phase = STOP[self._phase]
        self._queue.append(response)

    def _refusal(self, response: bytes, request: Request | None) -> bytes:
        """`response` as the `Rejected` hook sends it (counted, logged, with a request id)."""
        rejected = self._on_rejected
        return response if rejected is None else rejected(response, request)
