"""Two router processes sharing one Redis hold one limit between them, and fail open without it."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import aiohttp

from headcount.config import DiscoveryMode
from headcount.sim.cluster.flags import RouterFlags, Timings
from headcount.sim.cluster.polling import wait_until
from headcount.sim.cluster.process import RouterProcess
from headcount.sim.engine.config import EngineSimConfig
from headcount.sim.engine.server import running_engine
from tests.support.redis import RedisServer
from tests.support.redis import redis_server as redis_server

__all__: list[str] = []

LIMIT = 40
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


async def _statuses(
    session: aiohttp.ClientSession, urls: list[str], count: int, parallel: int = 8
) -> list[int]:
    """`count` chats spread over `urls` in turn, `parallel` at a time: each one's status."""
    targets = itertools.cycle(urls)
    statuses: list[int] = []
    for start in range(0, count, parallel):
        batch = [
            session.post(next(targets) + "/v1/chat/completions", json=CHAT)
            for _ in range(min(parallel, count - start))
        ]
        for response in await asyncio.gather(*batch):
            statuses.append(response.status)
            response.release()
    return statuses


async def _ready(router: RouterProcess) -> bool:
    return await router.client.status_of("/readyz") == 200


async def test_two_routers_hold_one_requests_per_minute_and_fail_open_when_redis_stops(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(f"[default]\nrequests_per_minute = {LIMIT}\n")
    async with running_engine(EngineSimConfig()) as engine:
        flags = RouterFlags(
            discovery=DiscoveryMode.STATIC,
            backends=(engine.url,),
            tenants_file=tenants,
            limits_store=redis_server.url,
            timings=Timings(probe_interval=0.2, limits_store_timeout=0.2),
        )
        async with (
            RouterProcess(flags, log_path=tmp_path / "a.log") as first,
            RouterProcess(flags, log_path=tmp_path / "b.log") as second,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        ):
            for router in (first, second):
                await wait_until(lambda r=router: _ready(r), timeout=15)  # type: ignore[misc]
            statuses = await _statuses(session, [first.url, second.url], 3 * LIMIT)
            assert set(statuses) == {200, 429}
            served = statuses.count(200)
            assert LIMIT * 0.95 <= served <= LIMIT * 1.05, served

            await redis_server.stop()
            after = await asyncio.wait_for(_statuses(session, [first.url, second.url], 16), 10)
            assert after == [200] * 16  # admitted unjudged, none waits past the store's timeout
            for router in (first, second):
                status, text = await router.client.get("/health")
                assert status == 200 and "limits store" in text and "fail-open" in text
                metrics = (await router.client.get("/metrics"))[1]
                assert "headcount_limits_store_up 0.0" in metrics
