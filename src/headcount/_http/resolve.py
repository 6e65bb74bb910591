"""Engine host names to addresses, one policy for the proxy and the probes: never cached.

getaddrinfo gives no TTL, so any cache could outlive the record it holds: a
Service deleted and recreated under the same name with a new ClusterIP was
dialled at its old address by the probes for as long as their cache lived
(aiohttp's 30 s), while the proxy, resolving per connection, already followed.
So every new connection, the proxy's or a probe's, looks the name up again
(a literal IP never is; a pooled connection keeps the address it was opened
to), with a timeout. A lookup that fails or times out is a `LookupFailed`: the
cluster DNS's trouble, not the engine's, so it never ejects an engine and a
short DNS outage cannot take the whole fleet out of rotation.

    resolver = Resolver(timeout=1.0)
    addresses = await resolver.resolve("vllm.llm", 8000)   # ["10.96.0.7"], or LookupFailed
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence

from headcount._http.errors import LocalResourceExhausted, LookupFailed, local_resource

__all__ = ["Lookup", "Resolver", "literal_address", "pinned_first", "system_lookup"]

Lookup = Callable[[str, int], Awaitable[Sequence[str]]]
"""(host, port) -> IP addresses, best first; raises OSError (`socket.gaierror`) when it fails.
`system_lookup` in production, a table in tests."""


async def system_lookup(host: str, port: int) -> Sequence[str]:
    """The system resolver through the event loop (a worker thread, never the loop itself)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def pinned_first(pinned: Mapping[str, str], lookup: Lookup = system_lookup) -> Lookup:
    """`lookup`, except for the host names in `pinned`, answered with their address at once
    (`--resolve NAME=ADDRESS`)."""
    if not pinned:
        return lookup
    table = {name.lower().rstrip("."): address for name, address in pinned.items()}

    async def pinned_or_looked_up(host: str, port: int) -> Sequence[str]:
        address = table.get(host.lower().rstrip("."))
        return (address,) if address is not None else await lookup(host, port)

    return pinned_or_looked_up


def literal_address(host: str) -> str | None:
    """`host` if it is an IP address already (nothing to look up), else None."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


class Resolver:
    """Looks a host name up on every call, bounded by `timeout`; see the module docstring."""

    __slots__ = ("_lookup", "timeout")

    def __init__(self, timeout: float, lookup: Lookup = system_lookup) -> None:
        """`timeout`: one lookup's bound (`--dns-timeout`), under the probe timeout so that
        a probe stuck on DNS is reported as a lookup failure, not as a silent engine."""
        self.timeout = timeout
        self._lookup = lookup

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        """The addresses `host` has now, or `LookupFailed` (`LocalResourceExhausted` when the
        router itself is out of memory or fds for the lookup)."""
        literal = literal_address(host)
        if literal is not None:
            return (literal,)
        try:
            async with asyncio.timeout(self.timeout):
                addresses = await self._lookup(host, port)
        except TimeoutError:
            raise LookupFailed(f"{host}: no answer within {self.timeout:g}s") from None
        except OSError as exc:
            resource = local_resource(exc)
            if resource is not None:
                raise LocalResourceExhausted(f"looking up {host}: {exc}", resource) from None
            raise LookupFailed(f"{host}: {exc.strerror or exc}") from None
        if not addresses:
            raise LookupFailed(f"{host}: no address")
        return addresses
