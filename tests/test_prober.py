"""The prober against real simulated engines: health, served models, load, never forgetting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import pytest

from headcount.config import ProbeSettings
from headcount.discovery.static import static_specs
from headcount.fleet import EngineState, Fleet, ProbeResult
from headcount.probe import Prober
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine, start_engine
from tests.support import wait_until

FAST = ProbeSettings(interval=0.1, timeout=0.5, unhealthy_after=2)


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    async with running_engine(EngineSimConfig(adapters=("lora-a",), max_running=1)) as sim:
        yield sim


async def probing(fleet: Fleet, settings: ProbeSettings = FAST) -> asyncio.Task[None]:
    return asyncio.create_task(Prober(fleet, settings).run())


def state(fleet: Fleet, url: str) -> EngineState | None:
    engine = fleet.snapshot.by_id.get(url)
    return engine.state if engine else None


async def test_a_new_engine_becomes_ready_with_its_models_and_adapters(engine: SimEngine) -> None:
    fleet = Fleet(unhealthy_after=FAST.unhealthy_after)
    task = await probing(fleet)
    try:
        fleet.reconcile("static", static_specs([engine.url]))
        await wait_until(lambda: state(fleet, engine.url) is EngineState.READY)
        ready = fleet.snapshot.by_id[engine.url]
        assert ready.models == ("sim-model",) and ready.adapters == ("lora-a",)
        assert [e.id for e in fleet.snapshot.candidates("lora-a")] == [engine.url]
    finally:
        task.cancel()


async def test_a_failing_engine_is_taken_out_of_rotation_but_never_forgotten(
    engine: SimEngine,
) -> None:
    fleet = Fleet(unhealthy_after=FAST.unhealthy_after)
    task = await probing(fleet)
    try:
        fleet.reconcile("static", static_specs([engine.url]))
        await wait_until(lambda: state(fleet, engine.url) is EngineState.READY)
        await engine.set_fail_mode("http-500")
        await wait_until(lambda: state(fleet, engine.url) is EngineState.UNHEALTHY)
        assert "HTTP 500" in (fleet.snapshot.by_id[engine.url].last_error or "")
        await engine.set_fail_mode("none")
        await wait_until(lambda: state(fleet, engine.url) is EngineState.READY)
    finally:
        task.cancel()


async def test_a_hung_engine_costs_one_timeout_and_others_are_not_held_up() -> None:
    settings = ProbeSettings(interval=30, timeout=0.5, concurrency=64)
    hung_configs = [EngineSimConfig(fail_mode="hang") for _ in range(6)]
    async with running_engine(EngineSimConfig()) as good:
        hung = [await start_engine(c) for c in hung_configs]
        fleet = Fleet(unhealthy_after=settings.unhealthy_after)
        task = await probing(fleet, settings)
        try:
            fleet.reconcile("static", static_specs([*(h.url for h in hung), good.url]))
            await wait_until(lambda: state(fleet, good.url) is EngineState.READY, timeout=0.4)
            await wait_until(
                lambda: all(state(fleet, h.url) is EngineState.UNHEALTHY for h in hung),
                timeout=1.5,
                what="every hung engine judged within about one probe timeout",
            )
        finally:
            task.cancel()
            for sim in hung:
                await sim.stop()


async def test_scraped_load_reaches_the_fleet() -> None:
    config = EngineSimConfig(token_delay=0.05, max_running=1)
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 40}
    async with running_engine(config) as engine, aiohttp.ClientSession() as session:
        fleet = Fleet(unhealthy_after=FAST.unhealthy_after)
        task = await probing(fleet)
        busy = [
            asyncio.create_task(session.post(engine.url + "/v1/completions", json=body))
            for _ in range(2)
        ]
        try:
            fleet.reconcile("static", static_specs([engine.url]))
            await wait_until(lambda: state(fleet, engine.url) is EngineState.READY)
            load = fleet.snapshot.by_id[engine.url].load
            await wait_until(
                lambda: (load.running, load.waiting, load.kv_usage) == (1.0, 1.0, 1.0),
                what="one request running, one waiting, the cache full",
            )
        finally:
            task.cancel()
            for request in busy:
                request.cancel()


class RecordingFleet(Fleet):
    """A fleet that notes when each engine's probe result arrived."""

    def __init__(self, settings: ProbeSettings) -> None:
        super().__init__(unhealthy_after=settings.unhealthy_after)
        self.probed: dict[str, list[float]] = {}

    def apply_probe(self, engine_id: str, result: ProbeResult) -> None:
        self.probed.setdefault(engine_id, []).append(time.monotonic())
        super().apply_probe(engine_id, result)


async def test_periodic_probes_are_spread_over_the_interval() -> None:
    interval = 1.0
    async with AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(running_engine(EngineSimConfig())) for _ in range(8)
        ]
        settings = ProbeSettings(interval=interval, timeout=0.5)
        fleet = RecordingFleet(settings)
        fleet.reconcile("static", static_specs([engine.url for engine in engines]))
        task = await probing(fleet, settings)
        try:
            await wait_until(
                lambda: all(len(fleet.probed.get(e.url, ())) >= 2 for e in engines),
                timeout=5,
                what="a periodic round after the first probe",
            )
        finally:
            task.cancel()
        second_round = sorted(fleet.probed[e.url][1] for e in engines)
        assert second_round[-1] - second_round[0] > interval / 2, second_round
