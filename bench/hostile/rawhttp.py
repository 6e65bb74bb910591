"""A small HTTP/1.1 client on raw asyncio sockets, so hostile benchmarks see exactly what arrives.

aiohttp would hide what the hostile benchmark looks for: bytes before a status
line, a second response the client never asked for, a 64 MiB header. Here a
`RawConnection` feeds every byte it reads to one `httptools` response parser
and queues each complete message, so an extra response planted on the
connection is the answer the *next* request gets, as with any keep-alive
client. Interim 1xx answers are skipped (not 101), as clients do; bodies and
header values are counted, and only their first `keep` bytes kept.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from dataclasses import dataclass, field

import httptools

__all__ = [
    "ConnectionClosed",
    "RawConnection",
    "RawResponse",
    "get_request",
    "post_request",
]

_READ_SIZE = 256 * 1024


class ConnectionClosed(Exception):
    """The server closed the connection (or it broke) before a whole response arrived."""


@dataclass
class RawResponse:
    """One response as the client parsed it."""

    status: int = 0
    header_bytes: int = 0
    """Names and values of every header field, summed."""
    body_size: int = 0
    body: bytearray = field(default_factory=bytearray)
    """The first `keep` bytes of the (de-chunked) body."""
    keep_alive: bool = True


class _Messages:
    """httptools callbacks: complete messages into a queue, the current one being built."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.current = RawResponse()
        self.done: deque[RawResponse] = deque()
        self.parser: httptools.HttpResponseParser | None = None

    def on_message_begin(self) -> None:
        self.current = RawResponse()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.header_bytes += len(name) + len(value)

    def on_body(self, body: bytes) -> None:
        current = self.current
        current.body_size += len(body)
        room = self.keep - len(current.body)
        if room > 0:
            current.body += body[:room]

    def on_message_complete(self) -> None:
        assert self.parser is not None
        status = self.parser.get_status_code()
        self.current.status = status
        self.current.keep_alive = self.parser.should_keep_alive()
        if status >= 200 or status == 101 or status < 100:
            self.done.append(self.current)


class RawConnection:
    """One keep-alive client connection: `send` bytes, then `response()` for each answer."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        self._messages = _Messages(keep)
        self._parser = httptools.HttpResponseParser(self._messages)
        self._messages.parser = self._parser
        self.received = 0
        self.closed = False

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        timeout: float = 5.0,
        keep: int = 64 * 1024,
        source: str | None = None,
    ) -> RawConnection:
        """`source`: the local address to connect from (the router tells clients apart by it)."""
        local = None if source is None else (source, 0)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=_READ_SIZE, local_addr=local), timeout
        )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, keep)

    async def send(self, data: bytes, timeout: float = 5.0) -> None:
        self.writer.write(data)
        await asyncio.wait_for(self.writer.drain(), timeout)

    async def response(self, timeout: float) -> RawResponse:
        """The next complete final response; `ConnectionClosed`, `TimeoutError` or
        `httptools.HttpParserError` otherwise."""
        deadline = time.monotonic() + timeout
        done = self._messages.done
        while not done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                data = await asyncio.wait_for(self.reader.read(_READ_SIZE), remaining)
            except TimeoutError:
                raise  # an OSError too, but the connection may yet answer
            except (ConnectionError, OSError) as exc:
                self.closed = True
                raise ConnectionClosed(str(exc) or type(exc).__name__) from None
            if not data:
                self.closed = True
                raise ConnectionClosed("EOF")
            self.received += len(data)
            self._parser.feed_data(data)
        return done.popleft()

    def abort(self) -> None:
        self.closed = True
        self.writer.transport.abort()

    def close(self) -> None:
        self.closed = True
        self.writer.close()


def get_request(path: str, extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nhost: bench\r\n%s\r\n" % (path.encode(), extra)


def post_request(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n" % (
        path.encode()
    ) + b"content-length: %d\r\n%s\r\n%s" % (len(body), extra, body)
