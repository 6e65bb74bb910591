"""Engines that say exact bytes: loopback servers whose every connection runs a script.

Where a test needs to see or send exact bytes (a planted answer, a cut body,
a silence), `raw_engine` stands in for an engine; `blackholed_listener` is a
port that never accepts.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import sys
import termios
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path

from headcount.sim.cluster.polling import wait_until

__all__ = [
    "EngineConnection",
    "RawEngine",
    "Script",
    "blackholed_listener",
    "raw_engine",
]

RAW_TIMEOUT = 5.0


class EngineConnection:
    """One accepted connection of a `RawEngine`, read request by request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def read_request(self) -> tuple[bytes, bytes] | None:
        """The next request's head and body, or None when the client closed."""
        try:
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), RAW_TIMEOUT)
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await asyncio.wait_for(self.reader.readexactly(length), RAW_TIMEOUT)
        return head, body

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until_read(self) -> None:
        """Wait until the client has read every byte sent so far, or closed the connection.

        The kernel's word for it (Linux): nothing waits in this side's write buffer or
        send queue, and the client's socket (`/proc/net/tcp`) has no unread byte. A piece
        sent after this arrives in a later read of the client's, whatever its timing.
        """
        await wait_until(self._read_by_peer, timeout=RAW_TIMEOUT, interval=0.001, what="a read")

    def _read_by_peer(self) -> bool:
        if self.writer.transport.get_write_buffer_size():
            return False
        sock = self.writer.get_extra_info("socket")
        if sock is None or sock.fileno() < 0:
            return True  # this side is closed: nothing more reaches the client
        unsent = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        if unsent:
            return False
        try:
            client = _proc_address(*sock.getpeername()[:2])
            own = _proc_address(*sock.getsockname()[:2])
        except OSError:
            return True  # the client has gone
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] == client and fields[2] == own:
                return int(fields[4].partition(":")[2], 16) == 0
        return True  # the client's socket is closed: it reads nothing more

    def close(self) -> None:
        self.writer.close()


def _proc_address(host: str, port: int) -> str:
    """An IPv4 address as /proc/net/tcp writes it: the address word in host order, the port."""
    word = int.from_bytes(socket.inet_aton(host), sys.byteorder)
    return f"{word:08X}:{port:04X}"


Script = Callable[[EngineConnection], Awaitable[None]]


class RawEngine:
    """A loopback HTTP server whose every connection runs `script`; counts connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.accepted = 0
        self.port = 0
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await self.script(EngineConnection(reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def raw_engine(script: Script) -> AsyncIterator[RawEngine]:
    engine = RawEngine(script)
    server = await asyncio.start_server(engine._serve, "127.0.0.1", 0)
    engine.port = server.sockets[0].getsockname()[1]
    engine.url = f"http://127.0.0.1:{engine.port}"
    try:
        yield engine
    finally:
        server.close()


@contextmanager
def blackholed_listener() -> Iterator[int]:
    """A port whose accept queue is full: further SYNs are dropped and connects hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
