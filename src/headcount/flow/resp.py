"""A minimal asyncio Redis client (RESP2): what the limits store needs, every wait bounded.

The store asks Redis once per admission, on the event loop, and must answer
within its timeout whatever Redis does: so every call here is bounded by one
deadline (dialling included), commands are pipelined on one connection (many
admissions in flight, replies matched in order), and a call that fails or
times out closes the connection and backs off: until the back-off ends, calls
fail at once instead of dialling a dead Redis again. The next call after it
dials again. Scripts run by `EVALSHA`, loaded on `NOSCRIPT` (a restarted
Redis has forgotten them).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeAlias, cast

from headcount.clock import Clock

__all__ = [
    "Arg",
    "RedisUnavailable",
    "Reply",
    "RespClient",
    "RespError",
    "RespParser",
    "RespProtocolError",
    "Script",
    "encode",
]

Reply: TypeAlias = "bytes | int | list[Reply] | RespError | None"
"""A RESP2 reply: a simple or bulk string, an integer, an array, an error (inside an
array; at the top it is raised), or nil."""

Arg: TypeAlias = "bytes | str | int | float"
"""A command's argument, sent as its decimal text when not bytes."""


class RespError(Exception):
    """Redis answered an error (`NOSCRIPT ...`): this command failed, the connection is fine."""


class RedisUnavailable(Exception):
    """Redis could not be asked, or did not answer in time; the message says why."""


class RespProtocolError(Exception):
    """What came back is not RESP2 (not Redis on that port?), or a reply too large."""


def encode(*args: Arg) -> bytes:
    """One command as Redis reads it: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(parts)


class RespParser:
    """Replies out of bytes as they arrive, however the stream splits them."""

    def __init__(self, max_reply: int = 1 << 20) -> None:
        self._buffer = bytearray()
        self._max_reply = max_reply

    def feed(self, data: bytes) -> list[Reply]:
        """Every reply `data` completes, in order; a partial one waits for more bytes."""
        self._buffer += data
        replies: list[Reply] = []
        position = 0
        while position < len(self._buffer):
            parsed = self._parse(position)
            if parsed is None:
                break
            reply, position = parsed
            replies.append(reply)
        del self._buffer[:position]
        if len(self._buffer) > self._max_reply:
            raise RespProtocolError(f"a reply larger than {self._max_reply} bytes")
        return replies

    def _parse(self, start: int) -> tuple[Reply, int] | None:
        """The reply at `start` and where the next one starts; None: not all here yet."""
        buffer = self._buffer
        end = buffer.find(b"\r\n", start)
        if end < 0:
            return None
        kind, line, position = buffer[start], bytes(buffer[start + 1 : end]), end + 2
        if kind == ord("+"):
            return line, position
        if kind == ord("-"):
            return RespError(line.decode("utf-8", "replace")), position
        if kind == ord(":"):
            return _integer(line), position
        if kind == ord("$"):
            size = self._length(line)
            if size == -1:
                return None, position
            if len(buffer) < position + size + 2:
                return None
            if buffer[position + size : position + size + 2] != b"\r\n":
                raise RespProtocolError("a bulk string not ended by CRLF")
            return bytes(buffer[position : position + size]), position + size + 2
        if kind == ord("*"):
            count = self._length(line)
            if count == -1:
                return None, position
            items: list[Reply] = []
            for _ in range(count):
                parsed = self._parse(position)
                if parsed is None:
                    return None
                item, position = parsed
                items.append(item)
            return items, position
        raise RespProtocolError(f"not a RESP reply: {bytes(buffer[start:end])[:40]!r}")

    def _length(self, line: bytes) -> int:
        length = _integer(line)
        if not -1 <= length <= self._max_reply:
            raise RespProtocolError(f"not a RESP length: {length}")
        return length


def _integer(line: bytes) -> int:
    if not line.removeprefix(b"-").isdigit():
        raise RespProtocolError(f"not a RESP integer: {line[:40]!r}")
    return int(line)


class Script:
    """A Lua script known by its SHA-1, as `EVALSHA` names it."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class _Connection(asyncio.Protocol):
    """One connection: commands written as they come, replies handed out in order."""

    def __init__(self, max_reply: int) -> None:
        self._parser = RespParser(max_reply)
        self._waiting: deque[asyncio.Future[Reply]] = deque()
        self._transport: asyncio.Transport | None = None
        self.lost: str | None = None
        """Why the connection is unusable (None while it is)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            replies = self._parser.feed(data)
        except RespProtocolError as exc:
            self.close(str(exc))
            return
        for reply in replies:
            if not self._waiting:
                self.close("a reply nobody asked for")
                return
            future = self._waiting.popleft()
            if future.done():  # its caller gave up
                continue
            if isinstance(reply, RespError):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose("connection closed by Redis" if exc is None else _describe(exc))

    def send(self, *commands: bytes) -> list[asyncio.Future[Reply]]:
        """Write `commands` at once; one future per reply."""
        if self.lost is not None or self._transport is None:
            raise RedisUnavailable(self.lost or "not connected")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Reply]] = [loop.create_future() for _ in commands]
        self._waiting.extend(futures)
        self._transport.write(b"".join(commands))
        return futures

    def close(self, reason: str) -> None:
        self._lose(reason)
        if self._transport is not None:
            self._transport.close()

    def _lose(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = reason
        for future in self._waiting:
            if not future.done():
                future.set_exception(RedisUnavailable(reason))
        self._waiting.clear()


class RespClient:
    """Commands to one Redis, each bounded by `timeout`; see the module docstring.

    After a failure the client waits `backoff[0]` seconds before it dials
    again, doubling with each failure in a row up to `backoff[1]`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float,
        db: int = 0,
        clock: Clock = time.monotonic,
        backoff: tuple[float, float] = (0.2, 2.0),
        max_reply: int = 1 << 20,
    ) -> None:
        self._host, self._port, self._db = host, port, db
        self._timeout = timeout
        self._clock = clock
        self._backoff = backoff
        self._max_reply = max_reply
        self._late = f"no answer within {round(timeout * 1000, 3):g}ms"
        self._conn: _Connection | None = None
        self._dialing: asyncio.Task[_Connection] | None = None
        self._failures = 0
        self._retry_at = -math.inf
        self._reason = ""

    async def call(self, *args: Arg) -> Reply:
        """One command's reply; `RespError` if Redis refused it, `RedisUnavailable` if no reply."""
        command = encode(*args)

        async def ask(conn: _Connection) -> Reply:
            (reply,) = conn.send(command)
            return await reply

        return await self._exchange(ask)

    async def evalsha(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Reply:
        """`script`'s reply, loading it first (in the same round trip) if Redis does not know it."""
        command = encode(b"EVALSHA", script.sha, len(keys), *keys, *args)

        async def run(conn: _Connection) -> Reply:
            (reply,) = conn.send(command)
            try:
                return await reply
            except RespError as error:
                if not str(error).startswith("NOSCRIPT"):
                    raise
            sent = conn.send(encode(b"SCRIPT", b"LOAD", script.source), command)
            # Unpacked, so the stub's type is the list gather returns: mypyc checks it.
            outcomes = await asyncio.gather(*sent, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            return cast(Reply, outcomes[1])

        return await self._exchange(run)

    async def close(self) -> None:
        if self._dialing is not None:
            self._dialing.cancel()
            await asyncio.wait([self._dialing])
        if self._conn is not None:
            self._conn.close("closed")
            self._conn = None

    async def _exchange(self, run: Callable[[_Connection], Awaitable[Reply]]) -> Reply:
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self._timeout):
                conn = await self._connected()
                reply = await run(conn)
        except TimeoutError:
            raise self._broken(conn, self._late) from None
        except RedisUnavailable as exc:
            raise self._broken(conn, str(exc)) from None
        self._failures = 0
        return reply

    async def _connected(self) -> _Connection:
        if self._conn is not None and self._conn.lost is None:
            return self._conn
        if self._dialing is None:
            if self._clock() < self._retry_at:
                raise RedisUnavailable(self._reason)
            self._dialing = asyncio.get_running_loop().create_task(self._dial())
            self._dialing.add_done_callback(_retrieve)
        return await asyncio.shield(self._dialing)

    async def _dial(self) -> _Connection:
        """A new connection, the database selected; a failure is counted once, here."""
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self._timeout):
                _, conn = await asyncio.get_running_loop().create_connection(
                    lambda: _Connection(self._max_reply), self._host, self._port
                )
                if self._db:
                    (selected,) = conn.send(encode(b"SELECT", self._db))
                    await selected
        except TimeoutError:
            reason = self._late
        except OSError as exc:
            reason = _describe(exc)
        except (RedisUnavailable, RespError) as exc:
            reason = str(exc)
        else:
            self._conn = conn
            return conn
        finally:
            self._dialing = None
        if conn is not None:
            conn.close(reason)
        self._fail(reason)
        raise RedisUnavailable(reason)

    def _broken(self, conn: _Connection | None, reason: str) -> RedisUnavailable:
        """The error to raise; the connection closed and the failure counted, once per connection.

        A call that timed out closes the connection: its reply may still come, and
        Redis may be stuck. Calls that fail with it count nothing more."""
        if conn is not None and conn is self._conn:
            self._conn = None
            conn.close(reason)
            self._fail(reason)
        return RedisUnavailable(reason)

    def _fail(self, reason: str) -> None:
        self._failures += 1
        first, most = self._backoff
        self._retry_at = self._clock() + min(most, first * 2 ** min(self._failures - 1, 30))
        self._reason = reason


def _retrieve(task: asyncio.Task[_Connection]) -> None:
    """A dial's failure reaches whoever waited; with none left, it is not an unretrieved error."""
    if not task.cancelled():
        task.exception()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return f"the host does not resolve ({exc.strerror})"
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()
    return str(exc) or type(exc).__name__
