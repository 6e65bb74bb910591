"""The proxy on 127.0.0.1 before simulated engines, as the proxy's own tests drive it.

`routed` starts `Proxy` with a fleet built as discovery would build it from
engine URLs (each one's id), then marked probed; `Routed` is what a test holds:
the proxy, its fleet and metrics, the engines and a client session. `Silent` is
a raw engine that never answers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from headcount._http.local import LocalRequest, LocalResponse
from headcount._http.pool import Dial
from headcount._http.resolve import Resolver
from headcount._http.tls import EngineTls
from headcount.config import OutlierSettings, ProxySettings
from headcount.fleet import Fleet
from headcount.proxy import Proxy, start_server
from headcount.routing import Policy, RoundRobin
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine
from headcount.surfaces.metrics import Metrics
from tests.support.builders import ready_fleet, spec
from tests.support.raw_engine import EngineConnection

__all__ = [
    "CHAT",
    "MODEL",
    "SETTINGS",
    "TIMEOUT",
    "Routed",
    "Silent",
    "chat",
    "local_app",
    "routed",
    "sim",
]

TIMEOUT = 10.0
MODEL = "sim-model"
CHAT = "/v1/chat/completions"
SETTINGS = ProxySettings(connect_timeout=1.0, read_timeout=5.0, max_body_size=64 * 1024)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "say hi"}], **extra}


async def local_app(request: LocalRequest) -> LocalResponse:
    """Stands in for the lead's admin app: echoes what it was given."""
    if request.path == "/boom":
        raise RuntimeError("secret internal detail")
    status = 200 if request.path in ("/v1/models", "/echo") else 404
    document = {
        "method": request.method,
        "path": request.path,
        "query": request.query,
        "agent": request.headers.get("user-agent", ""),
        "body": request.body.decode(),
    }
    return LocalResponse(status, json.dumps(document).encode(), headers={"x-local": "yes"})


@dataclass
class Routed:
    url: str
    port: int
    proxy: Proxy
    fleet: Fleet
    metrics: Metrics
    engines: list[SimEngine]
    session: aiohttp.ClientSession
    engine_ids: list[str] = field(default_factory=list)

    def loads(self) -> list[tuple[int, int, int]]:
        """(in_flight, requests, failures) per engine, in engine order."""
        by_id = self.fleet.snapshot.by_id
        return [
            (by_id[i].load.in_flight, by_id[i].load.requests, by_id[i].load.failures)
            for i in self.engine_ids
        ]

    def all_released(self) -> bool:
        return (
            all(in_flight == 0 for in_flight, _, _ in self.loads())
            and not self.proxy.in_flight
            and not self.proxy.awaiting_first_byte
        )

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.sample(name, labels) or 0.0

    async def post(self, path: str, body: object) -> tuple[int, dict[str, Any], dict[str, str]]:
        async with self.session.post(self.url + path, json=body) as response:
            return response.status, await response.json(content_type=None), dict(response.headers)


@asynccontextmanager
async def routed(
    *configs: EngineSimConfig,
    extra_urls: Sequence[str] = (),
    settings: ProxySettings = SETTINGS,
    policy: Policy | None = None,
    outliers: OutlierSettings | None = None,
    resolver: Resolver | None = None,
    dial: Dial | None = None,
    engine_tls: EngineTls | None = None,
) -> AsyncIterator[Routed]:
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(running_engine(c)) for c in configs]
        urls = [*(engine.url for engine in engines), *extra_urls]
        fleet = ready_fleet(
            *(spec(url, url=url) for url in urls),
            cards=({"id": MODEL},),
            outliers=outliers or OutlierSettings(),
            clock=time.monotonic,
        )
        metrics = Metrics(lambda: fleet.snapshot)
        proxy = Proxy(
            fleet,
            policy or RoundRobin(),
            settings,
            metrics,
            local_app,
            resolver=resolver,
            dial=dial,
            engine_tls=engine_tls,
        )
        server = await start_server(proxy, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        )
        setup = Routed(f"http://127.0.0.1:{port}", port, proxy, fleet, metrics, engines, session)
        setup.engine_ids = urls
        try:
            yield setup
        finally:
            await proxy.close()


def sim(name: str, **options: Any) -> EngineSimConfig:
    return EngineSimConfig(name=name, **options)


class Silent:
    """A raw engine script: reads each request, never answers, until `release` is set."""

    def __init__(self, answer: bytes = b"") -> None:
        self.requests = 0
        self.answer = answer
        self.release = asyncio.Event()

    async def __call__(self, conn: EngineConnection) -> None:
        while await conn.read_request() is not None:
            self.requests += 1
            if not self.answer:
                await conn.reader.read()  # until the router hangs up
                return
            await self.release.wait()
            await conn.send(self.answer)
