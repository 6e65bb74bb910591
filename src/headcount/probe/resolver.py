"""The proxy's resolver as aiohttp's `AbstractResolver`: probes look engine names up as it does.

aiohttp's own DNS cache (`ttl_dns_cache`) kept dialling a recreated Service's
old ClusterIP for 30 s while the proxy had already followed the new one. The
prober's connector uses this adapter with aiohttp's cache off, so both sides
share one policy (`headcount._http.resolve`): looked up per connection, never
cached. A failed lookup surfaces as `LookupFailed` (not an OSError, so aiohttp
passes it through as it is), which the prober reports as `dns: ...` without
counting it against the engine.
"""

from __future__ import annotations

import socket

from aiohttp.abc import AbstractResolver, ResolveResult

from headcount._http.errors import LookupFailed
from headcount._http.resolve import Resolver

__all__ = ["ProbeResolver"]

_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


class ProbeResolver(AbstractResolver):
    """Answers aiohttp's lookups with the shared `Resolver`."""

    def __init__(self, resolver: Resolver) -> None:
        self._resolver = resolver

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results: list[ResolveResult] = []
        for address in await self._resolver.resolve(host, port):
            found = socket.AF_INET6 if ":" in address else socket.AF_INET
            if family in (socket.AF_UNSPEC, found):
                results.append(
                    ResolveResult(
                        hostname=host,
                        host=address,
                        port=port,
                        family=found,
                        proto=0,
                        flags=_NUMERIC,
                    )
                )
        if not results:
            raise LookupFailed(f"{host}: no {family.name} address")
        return results

    async def close(self) -> None:
        """Nothing to release: the resolver holds no connection and no cache."""
