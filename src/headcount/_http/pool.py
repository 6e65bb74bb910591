"""Keep-alive connections to engines, a pool per engine, and how a new one is opened.

    pool = upstreams.pool(engine.id, engine.url)   # host and port parsed once per engine
    connection = pool.take()                       # an idle connection, or None: no Task
    if connection is None:
        connection = await pool.connect()          # only new connections need a coroutine
    connection.send(request_bytes, listener)

Idle connections leave the pool when the engine closes them, after
`idle_timeout`, or when the pool closes (its engine left the fleet).

Connecting: the host name is looked up for every new connection through the
shared `Resolver` (never cached; a literal IP is used as is), then each address
is tried in order within `connect_timeout`. A failed lookup is `LookupFailed`
and the router's own exhaustion (EMFILE, ENFILE, ENOMEM, ENOBUFS) is
`LocalResourceExhausted`: neither is `ConnectFailed`, which blames the engine.

An `https://` engine is dialled with the router's one `EngineTls` (`tls.py`): the
handshake happens inside `connect_timeout`, a certificate that does not verify is
a `ConnectFailed` saying so, and the connection's protocol is the same. A plain
`http://` engine's pool dials exactly as before, with no TLS object in its path.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from headcount._http.errors import (
    ConnectFailed,
    ConnectTimeout,
    LocalResourceExhausted,
    local_resource,
)
from headcount._http.resolve import Resolver, literal_address
from headcount._http.tls import EngineTls, tls_failure
from headcount._http.upstream import UpstreamConnection

__all__ = ["Dial", "PoolOptions", "UpstreamPool", "Upstreams"]

Dial = Callable[
    [Callable[[], "UpstreamConnection"], str, int],
    Awaitable[tuple[asyncio.BaseTransport, "UpstreamConnection"]],
]
"""Opens a TCP connection to (address, port) with a protocol factory: `loop.create_connection`
in production; tests inject failures (EMFILE) here (plain HTTP engines only)."""


async def _create_connection(
    factory: Callable[[], UpstreamConnection], address: str, port: int
) -> tuple[asyncio.BaseTransport, UpstreamConnection]:
    return await asyncio.get_running_loop().create_connection(factory, address, port)


def _tls_dial(tls: EngineTls | None, host: str) -> Dial:
    """Dials one https engine: TLS over TCP, asking for (and verifying) its server name."""

    async def create_tls_connection(
        factory: Callable[[], UpstreamConnection], address: str, port: int
    ) -> tuple[asyncio.BaseTransport, UpstreamConnection]:
        if tls is None:
            raise ConnectFailed("an https engine, and the router was given no TLS settings")
        try:
            return await asyncio.get_running_loop().create_connection(
                factory,
                address,
                port,
                ssl=tls.context,
                server_hostname=tls.server_hostname(host),
            )
        except ssl.SSLError as exc:
            raise ConnectFailed(f"TLS handshake failed: {tls_failure(exc)}") from None

    return create_tls_connection


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """How every engine's pool connects and how long its connections may wait."""

    connect_timeout: float
    read_timeout: float
    """Longest silence between two bytes of a response."""
    idle_timeout: float
    """An idle pooled connection closes after this."""
    max_idle: int
    """Idle connections kept per engine."""
    max_head_size: int
    """A response's status line and headers; more is a `ProtocolViolation`."""
    resolver: Resolver
    """Looks engine host names up; shared with the probes."""
    dial: Dial | None = None
    """Opens connections: `loop.create_connection` unless a test injects failures."""
    tls: EngineTls | None = None
    """How https engines are dialled (`tls.py`); plain http engines never read it."""


class UpstreamPool:
    """Keep-alive connections to one engine; the most recently used is reused first."""

    __slots__ = (
        "_addresses",
        "_closed",
        "_dial",
        "_idle",
        "_resolver",
        "connect_timeout",
        "host",
        "host_header",
        "idle_timeout",
        "max_head_size",
        "max_idle",
        "port",
        "read_timeout",
        "tick",
        "url",
    )

    def __init__(
        self,
        url: str,
        options: PoolOptions,
    ) -> None:
        parts = urlsplit(url)
        secure = parts.scheme == "https"
        self.url = url
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if secure else 80)
        self.host_header = b"host: %s\r\n" % parts.netloc.encode("idna")
        self.connect_timeout = options.connect_timeout
        self.read_timeout = options.read_timeout
        self.idle_timeout = options.idle_timeout
        self.tick = min(options.read_timeout, options.idle_timeout)
        self.max_idle = options.max_idle
        self.max_head_size = options.max_head_size
        self._resolver = options.resolver
        if secure:
            self._dial = _tls_dial(options.tls, self.host)
        else:
            self._dial = options.dial or _create_connection
        literal = literal_address(self.host)
        self._addresses = None if literal is None else (literal,)
        self._idle: dict[UpstreamConnection, None] = {}
        self._closed = False

    @property
    def idle(self) -> int:
        return len(self._idle)

    def take(self) -> UpstreamConnection | None:
        """An idle connection, or None if there is none."""
        idle = self._idle
        while idle:
            connection, _ = idle.popitem()
            if not connection.closed:
                return connection
        return None

    async def connect(self) -> UpstreamConnection:
        """A new connection to the address the host name has now, each tried in turn.

        `ConnectFailed`/`ConnectTimeout` (within `connect_timeout`, after the lookup),
        `LookupFailed` (the resolver's), or `LocalResourceExhausted`.
        """
        loop = asyncio.get_running_loop()
        addresses = self._addresses or await self._resolver.resolve(self.host, self.port)
        failure: OSError | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                for address in addresses:
                    try:
                        _, connection = await self._dial(
                            lambda: UpstreamConnection(self, loop), address, self.port
                        )
                    except OSError as exc:
                        resource = local_resource(exc)
                        if resource is not None:
                            raise LocalResourceExhausted(
                                f"connecting to {self.host}: {exc.strerror or exc}", resource
                            ) from None
                        failure = exc
                        continue
                    return connection
        except TimeoutError:
            raise ConnectTimeout(f"not accepted within {self.connect_timeout:g}s") from None
        if failure is None:  # unreachable: the resolver answers LookupFailed, not no address
            raise ConnectFailed(f"no address to connect to for {self.host}")
        raise ConnectFailed(failure.strerror or str(failure) or type(failure).__name__)

    def release(self, connection: UpstreamConnection) -> None:
        if self._closed or len(self._idle) >= self.max_idle:
            connection.close()
        else:
            self._idle[connection] = None

    def discard(self, connection: UpstreamConnection) -> None:
        self._idle.pop(connection, None)

    def close(self) -> None:
        """Close idle connections now; busy ones close when their response ends."""
        self._closed = True
        idle = list(self._idle)
        self._idle.clear()
        for connection in idle:
            connection.close()


class Upstreams:
    """One pool per engine id; the proxy drops the pools of engines that left the fleet."""

    def __init__(self, options: PoolOptions) -> None:
        self._options = options
        self._pools: dict[str, UpstreamPool] = {}

    def pool(self, engine_id: str, url: str) -> UpstreamPool:
        pool = self._pools.get(engine_id)
        if pool is None or pool.url != url:
            if pool is not None:
                pool.close()
            pool = UpstreamPool(url, self._options)
            self._pools[engine_id] = pool
        return pool

    def drop(self, engine_ids: Iterable[str]) -> None:
        for engine_id in engine_ids:
            pool = self._pools.pop(engine_id, None)
            if pool is not None:
                pool.close()

    def close(self) -> None:
        self.drop(list(self._pools))

    def __len__(self) -> int:
        return len(self._pools)
