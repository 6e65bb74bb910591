"""The prober against engines on loopback: health, models, load; its pacing on a fake clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack

import aiohttp
import pytest

from headcount.config import ProbeSettings
from headcount.discovery.static import static_specs
from headcount.fleet import EngineState, Fleet, ProbeResult
from headcount.probe import Prober
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine
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


class Unanswering:
    """An engine that accepts connections and never answers, counting what reached it."""

    def __init__(self) -> None:
        self.connections = 0
        self._held: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Unanswering:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._held.append(writer)

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.close()
        for writer in self._held:
            writer.close()
        await self._server.wait_closed()


async def test_a_hung_engine_costs_one_timeout_and_others_are_not_held_up() -> None:
    settings = ProbeSettings(interval=30, timeout=0.5, concurrency=64)
    async with AsyncExitStack() as stack:
        good = await stack.enter_async_context(running_engine(EngineSimConfig()))
        hung = [await stack.enter_async_context(Unanswering()) for _ in range(6)]
        reached_when_judged: list[list[int]] = []

        def on_probe(engine_id: str) -> None:
            if engine_id != good.url:
                reached_when_judged.append([h.connections for h in hung])

        fleet = RecordingFleet(settings, on_probe=on_probe)
        task = await probing(fleet, settings)
        try:
            fleet.reconcile("static", static_specs([*(h.url for h in hung), good.url]))
            await wait_until(
                lambda: all(state(fleet, h.url) is EngineState.UNHEALTHY for h in hung),
                what="every hung engine judged",
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert fleet.order[0] == good.url, "the good engine is judged before any hung one"
        assert state(fleet, good.url) is EngineState.READY
        assert all(reached_when_judged[0]), (
            "every hung engine was being probed when the first one timed out: "
            f"one timeout for all, not one each ({reached_when_judged[0]})"
        )


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
    """A fleet that notes each probe result: in what order, and when on `clock`."""

    def __init__(
        self,
        settings: ProbeSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_probe: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(unhealthy_after=settings.unhealthy_after)
        self.order: list[str] = []
        self.probed: dict[str, list[float]] = {}
        self._clock = clock
        self._on_probe = on_probe

    def apply_probe(self, engine_id: str, result: ProbeResult) -> None:
        self.order.append(engine_id)
        self.probed.setdefault(engine_id, []).append(self._clock())
        if self._on_probe is not None:
            self._on_probe(engine_id)
        super().apply_probe(engine_id, result)


class SteppedClock:
    """A fake clock the test moves on: `sleep` returns once `advance` has passed its end."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, wake))
        await wake

    @property
    def sleeping(self) -> bool:
        return any(not wake.done() for _, wake in self._sleepers)

    def advance(self) -> None:
        """Move to the end of the earliest sleep and wake every sleep that ends by then."""
        self._sleepers = [(end, wake) for end, wake in self._sleepers if not wake.done()]
        self.now = min(end for end, _ in self._sleepers)
        for end, wake in self._sleepers:
            if end <= self.now:
                wake.set_result(None)


async def test_periodic_probes_are_spread_over_the_interval() -> None:
    interval, count = 1.0, 8
    clock = SteppedClock()
    async with AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(running_engine(EngineSimConfig())) for _ in range(count)
        ]
        settings = ProbeSettings(interval=interval, timeout=0.5)
        fleet = RecordingFleet(settings, clock=clock)
        fleet.reconcile("static", static_specs([engine.url for engine in engines]))
        task = asyncio.create_task(Prober(fleet, settings, sleep=clock.sleep).run())
        try:
            await wait_until(lambda: len(fleet.order) == count, what="every engine probed once")
            for probes in range(count, 2 * count):
                await wait_until(lambda: clock.sleeping, what="the prober waiting")
                clock.advance()
                await wait_until(lambda n=probes: len(fleet.order) > n, what="the next probe")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    second_round = sorted(fleet.probed[e.url][1] for e in engines)
    assert second_round == pytest.approx([interval * n / count for n in range(1, count + 1)])
    assert second_round[-1] - second_round[0] > interval / 2, second_round
