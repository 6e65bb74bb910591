"""The prober against engines on loopback: health, models, load; its pacing on a fake clock.

Hostile engines (answers too long, too deep, not JSON, cut short) end in a
failed probe with a reason or a ready engine holding only scalar card fields,
never a task that dies unobserved.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import replace

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headcount.config import ProbeSettings
from headcount.discovery.static import static_specs
from headcount.fleet import Engine, EngineState, Fleet, ProbeResult
from headcount.probe import prober as probe
from headcount.probe.prober import Prober
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine
from tests.support import EngineConnection, FakeClock, raw_engine, wait_until

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


@pytest.mark.parametrize("blocked", [True, False])
async def test_a_timeout_that_fires_late_because_the_loop_was_blocked_blames_no_engine(
    blocked: bool,
) -> None:
    settings = ProbeSettings(interval=30, timeout=1.0, unhealthy_after=1)
    async with Unanswering() as hung:
        fleet = Fleet(unhealthy_after=1)
        task = await probing(fleet, settings)
        try:
            fleet.reconcile("static", static_specs([hung.url]))
            await wait_until(lambda: hung.connections > 0, what="the probe in flight")
            if blocked:  # the fault: the router's own loop stalls, on purpose
                time.sleep(2.5 * settings.timeout)  # noqa: ASYNC251
            await wait_until(
                lambda: fleet.snapshot.by_id[hung.url].last_error is not None,
                what="the probe judged",
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        engine = fleet.snapshot.by_id[hung.url]
        if blocked:
            assert engine.state is EngineState.PENDING, engine.last_error
            assert "the router's own loop was blocked" in (engine.last_error or "")
        else:
            assert engine.state is EngineState.UNHEALTHY
            assert engine.last_error == "/v1/models: no answer within the probe timeout"


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


async def test_the_engines_prefix_cache_figures_reach_the_fleet() -> None:
    config = EngineSimConfig(kv_blocks=123, block_size=8)
    body = {"model": "sim-model", "prompt": "the same long prompt " * 8, "max_tokens": 1}
    async with running_engine(config) as engine, aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.post(engine.url + "/v1/completions", json=body) as answer:
                assert answer.status == 200
        async with session.get(engine.url + "/sim/kv-cache") as answer:
            truth = await answer.json()
        fleet = Fleet(unhealthy_after=FAST.unhealthy_after)
        task = await probing(fleet)
        try:
            fleet.reconcile("static", static_specs([engine.url]))
            await wait_until(lambda: state(fleet, engine.url) is EngineState.READY)
            load = fleet.snapshot.by_id[engine.url].load
            assert (load.kv_capacity_blocks, load.kv_block_size) == (123, 8)
            assert (load.prefix_cache_queries, load.prefix_cache_hits) == (
                truth["queries"],
                truth["hits"],
            )
            assert 0 < truth["hits"] < truth["queries"]
        finally:
            task.cancel()


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


async def test_periodic_probes_are_spread_over_the_interval() -> None:
    interval, count = 1.0, 8
    clock = FakeClock(0.0, sleeps="step")
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


# ------------------------------------------------------------------ hostile answers


class Answers:
    """A loopback engine whose answers the test sets: exact bytes per path, keep-alive."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {"/v1/models": MODELS, "/metrics": b""}
        self.heads: dict[str, bytes] = {}
        """A path's head, when the test wants to lie about the body (content-length)."""
        self.endless: set[str] = set()
        """Paths answered with chunks that never end (at most ENDLESS_LIMIT bytes)."""
        self.sent: dict[str, int] = {}

    async def script(self, conn: EngineConnection) -> None:
        try:
            while (request := await conn.read_request()) is not None:
                path = request[0].split(b" ", 2)[1].decode()
                if path in self.endless:
                    await self._endless(conn, path)
                    return
                body = self.bodies.get(path, b"no")
                status = b"200 OK" if path in self.bodies else b"404 Not Found"
                head = self.heads.get(path) or b"HTTP/1.1 %s\r\ncontent-length: %d\r\n\r\n" % (
                    status,
                    len(body),
                )
                await conn.send(head + body)
                self.sent[path] = self.sent.get(path, 0) + len(body)
                if path in self.heads:
                    return  # the body was cut short: close
        except (TimeoutError, ConnectionError):
            return

    async def _endless(self, conn: EngineConnection, path: str) -> None:
        await conn.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (ENDLESS_CHUNK, b" " * ENDLESS_CHUNK)
        while self.sent.get(path, 0) < ENDLESS_LIMIT:
            await conn.send(chunk)
            self.sent[path] = self.sent.get(path, 0) + ENDLESS_CHUNK


ENDLESS_CHUNK = 64 * 1024
ENDLESS_LIMIT = 256 * 1024 * 1024
MODELS = json.dumps({"object": "list", "data": [{"id": "m"}, {"id": "a", "parent": "m"}]}).encode()
SMALL = ProbeSettings(interval=0.1, timeout=5, unhealthy_after=1, max_bytes=64 * 1024)


@contextlib.asynccontextmanager
async def probed(
    answers: Answers, settings: ProbeSettings = SMALL
) -> AsyncIterator[tuple[Fleet, str]]:
    """A fleet holding the engine serving `answers`, probed until the block ends."""
    async with raw_engine(answers.script) as engine:
        fleet = Fleet(unhealthy_after=settings.unhealthy_after)
        task = asyncio.create_task(Prober(fleet, settings).run())
        try:
            fleet.reconcile("static", static_specs([engine.url]))
            yield fleet, engine.url
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def unobserved_errors() -> AsyncIterator[list[dict[str, object]]]:
    """What reaches the loop's exception handler in the block ("Task exception was never
    retrieved" among them: garbage is collected before the block ends)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        yield errors
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)


def judged(fleet: Fleet, url: str) -> Engine | None:
    engine = fleet.snapshot.by_id[url]
    return engine if engine.state is not EngineState.PENDING else None


async def test_an_answer_over_the_byte_limit_fails_the_probe_and_is_not_read_further() -> None:
    answers = Answers()
    answers.endless.add("/v1/models")
    async with probed(answers) as (fleet, url):
        engine = await wait_until(lambda: judged(fleet, url), timeout=10)
    assert engine.state is EngineState.UNHEALTHY
    assert engine.last_error == "/v1/models: answer over 65536 bytes"
    assert answers.sent["/v1/models"] < ENDLESS_LIMIT / 4, "the prober hung up at the limit"


async def test_a_long_model_list_is_read_up_to_max_models_even_past_the_byte_limit() -> None:
    cards = [{"id": f"lora-{i:05d}", "parent": "m", "root": "r" * 200} for i in range(2000)]
    answers = Answers()
    answers.bodies["/v1/models"] = json.dumps({"data": cards}).encode()
    assert len(answers.bodies["/v1/models"]) > 4 * SMALL.max_bytes
    async with probed(answers, replace(SMALL, max_models=100)) as (fleet, url):
        engine = await wait_until(lambda: judged(fleet, url))
    assert engine.state is EngineState.READY
    assert engine.served == tuple(f"lora-{i:05d}" for i in range(100))


async def test_a_model_list_stamped_anew_at_each_probe_changes_nothing_in_the_fleet() -> None:
    # vLLM stamps `created` at each request: were it kept, every probe would rebuild the snapshot.
    answers = Answers()
    stamped = {"object": "list", "data": [{"id": "m", "object": "model", "created": 1}]}
    answers.bodies["/v1/models"] = json.dumps(stamped).encode()
    async with probed(answers) as (fleet, url):
        await wait_until(lambda: judged(fleet, url))
        before = fleet.snapshot
        sent = answers.sent["/v1/models"]
        stamped["data"][0]["created"] = 2
        answers.bodies["/v1/models"] = json.dumps(stamped).encode()
        await wait_until(
            lambda: answers.sent["/v1/models"] >= sent + 2 * len(answers.bodies["/v1/models"])
        )
        assert fleet.snapshot is before
        assert before.by_id[url].state is EngineState.READY


async def test_metrics_over_the_limit_leave_the_engine_ready_with_load_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="headcount.probe")
    answers = Answers()
    answers.bodies["/metrics"] = b"vllm:num_requests_running 3\n" * 3000
    async with probed(answers) as (fleet, url):
        engine = await wait_until(lambda: judged(fleet, url))
        assert engine.state is EngineState.READY
        assert (engine.load.running, engine.load.kv_usage) == (0.0, None)
        await wait_until(lambda: answers.sent["/metrics"] >= 3 * len(answers.bodies["/metrics"]))
        answers.bodies["/metrics"] = b"vllm:num_requests_running 3\n"
        await wait_until(lambda: fleet.snapshot.by_id[url].load.running == 3.0)
    told = [r for r in caplog.records if "load unknown" in r.getMessage()]
    assert len(told) == 1, "once per engine and reason, not per probe"
    assert "/metrics: answer over 65536 bytes" in told[0].getMessage()


async def test_cards_keep_only_scalar_fields_and_at_most_max_models(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cards = [{"id": "m", "owned_by": "vllm", "permission": [{"id": "p", "x": {}}]}]
    cards += [{"id": f"lora-{i}", "parent": "m", "evil": {"deep": [1]}} for i in range(24)]
    answers = Answers()
    answers.bodies["/v1/models"] = json.dumps({"object": "list", "data": cards}).encode()
    settings = replace(SMALL, max_models=10)
    async with probed(answers, settings) as (fleet, url):
        engine = await wait_until(lambda: judged(fleet, url))
        await wait_until(
            lambda: answers.sent["/v1/models"] >= 3 * len(answers.bodies["/v1/models"])
        )
    assert engine.cards[0] == {"id": "m", "owned_by": "vllm"}
    assert engine.cards[1:] == tuple({"id": f"lora-{i}", "parent": "m"} for i in range(9))
    told = [r for r in caplog.records if "lists more than 10 models" in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.WARNING


async def test_a_ready_engine_whose_model_list_turns_deeply_nested_leaves_rotation() -> None:
    answers = Answers()
    async with probed(answers) as (fleet, url):
        await wait_until(lambda: judged(fleet, url))
        assert fleet.snapshot.by_id[url].state is EngineState.READY
        answers.bodies["/v1/models"] = b'{"object": "list", "data": ' + b"[" * 50_000
        engine = await wait_until(
            lambda: (e := fleet.snapshot.by_id[url]).state is EngineState.UNHEALTHY and e
        )
    assert engine.last_error == "/v1/models: nested deeper than 32 levels"


class Exploding:
    """Stands in for the model-list parser: raises what nobody foresaw, where the test says."""

    where = "feed"

    def __init__(self, max_models: int) -> None:
        self.full = False

    def feed(self, data: bytes) -> None:
        if self.where == "feed":
            raise RecursionError("maximum recursion depth exceeded")

    def close(self) -> None:
        raise RecursionError("maximum recursion depth exceeded")


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("feed", "/v1/models: RecursionError: maximum recursion depth exceeded"),
        ("close", "probe: RecursionError: maximum recursion depth exceeded"),
    ],
)
async def test_any_exception_while_probing_is_a_failed_probe_logged_once_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, where: str, reason: str
) -> None:
    monkeypatch.setattr(Exploding, "where", where)
    monkeypatch.setattr(probe, "ModelListParser", Exploding)
    answers = Answers()
    async with probed(answers) as (fleet, url):
        engine = await wait_until(lambda: judged(fleet, url))
        await wait_until(lambda: answers.sent["/v1/models"] >= 4 * len(MODELS))
    assert engine.state is EngineState.UNHEALTHY
    assert engine.last_error == reason
    told = [r for r in caplog.records if "RecursionError" in r.getMessage()]
    by_prober = [r for r in told if r.name == "headcount.probe"]
    assert len(by_prober) == 1 and by_prober[0].exc_info is not None
    assert [r.name for r in told if r not in by_prober] == ["headcount.fleet"], "its change"


class BrokenOnce(Fleet):
    """A fleet whose first probe record fails: a bug outside the probe itself."""

    def __init__(self) -> None:
        super().__init__(unhealthy_after=1)
        self.broken = True

    def apply_probe(self, engine_id: str, result: ProbeResult) -> None:
        if self.broken:
            self.broken = False
            raise RuntimeError("bug in the fleet")
        super().apply_probe(engine_id, result)


async def test_what_escapes_a_probe_task_is_logged_and_the_engine_probed_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with unobserved_errors() as errors, raw_engine(Answers().script) as engine:
        fleet = BrokenOnce()
        task = asyncio.create_task(Prober(fleet, SMALL).run())
        try:
            fleet.reconcile("static", static_specs([engine.url]))
            await wait_until(lambda: judged(fleet, engine.url))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert not errors, errors
    told = [r for r in caplog.records if r.getMessage() == f"probe {engine.url} failed"]
    assert len(told) == 1 and told[0].exc_info is not None


VLLM_LIKE = json.dumps(
    {
        "object": "list",
        "data": [
            {
                "id": "m",
                "object": "model",
                "root": "m",
                "parent": None,
                "permission": [{"id": "p", "allow_view": True, "group": None}],
            }
        ],
    }
).encode()


_hostile_json = st.one_of(
    st.builds(lambda n: b'{"data": ' + b"[" * n + b"]" * n + b"}", st.integers(1, 5000)),
    st.builds(lambda n: b'{"data": [{"id": "m", "x": ' + b"{" * n, st.integers(1, 5000)),
    st.builds(
        lambda d: b'{"data": [{"id": "m", "created": %s}]}' % d.encode(),
        st.text("0123456789eE.-+", min_size=1, max_size=40),
    ),
    st.builds(
        lambda d: b'{"data": [{"id": "m", "max_model_len": 1%s}]}' % (b"0" * d),
        st.integers(0, 6000),
    ),
    st.sampled_from(
        [
            b'{"data": [{"id": "m", "x": NaN}]}',
            b'{"data": [{"id": "m", "x": -Infinity}]}',
            b'{"data": [{"id": 7}, {"id": null}, {"id": ["m"]}]}',
            b'{"data": "m"}',
            b'{"data": [{"id": "m\xff\xfe"}]}',
            b'{"data": [{"id": "\\ud800"}]}',
            b'{"data": [{"id": "m"}]',
            b"[]",
            b"null",
            b"",
        ]
    ),
    st.binary(max_size=200),
    st.builds(lambda body, cut: body[:cut], st.just(VLLM_LIKE), st.integers(0, 400)),
)
_hostile_metrics = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda value: b"vllm:num_requests_running %s\nvllm:num_requests_waiting 1\n" % value,
        st.sampled_from([b"NaN", b"+Inf", b"-Inf", b"1e999", b"9" * 5000, b"x", b""]),
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models=_hostile_json, metrics=_hostile_metrics, truncate=st.booleans())
async def test_a_hostile_engine_ends_ready_or_unhealthy_with_a_reason_never_a_task_error(
    models: bytes, metrics: bytes, truncate: bool
) -> None:
    answers = Answers()
    answers.bodies.update({"/v1/models": models, "/metrics": metrics})
    if truncate:
        answers.heads["/v1/models"] = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (
            len(models) + 10
        )
    async with unobserved_errors() as errors, probed(answers) as (fleet, url):
        engine = await wait_until(lambda: judged(fleet, url))
    assert not errors, errors
    if engine.state is EngineState.READY:
        assert engine.served and all(_scalars_only(card) for card in engine.cards)
        assert all(
            v is None or math.isfinite(v)
            for v in (engine.load.running, engine.load.waiting, engine.load.kv_usage)
        )
    else:
        assert engine.state is EngineState.UNHEALTHY and engine.last_error, engine


def _scalars_only(card: Mapping[str, object]) -> bool:
    return all(
        isinstance(value, str | int | float | bool) or value is None for value in card.values()
    )


async def test_a_failing_engine_is_told_once_per_change_never_once_per_probe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fleet tells each change of state; the prober only a failure that changed none."""
    caplog.set_level(logging.INFO, logger="headcount")
    answers = Answers()
    del answers.bodies["/v1/models"]
    settings = replace(SMALL, unhealthy_after=2)
    async with probed(answers, settings) as (fleet, url):
        await wait_until(lambda: state(fleet, url) is EngineState.UNHEALTHY)
        answers.bodies["/v1/models"] = MODELS
        await wait_until(lambda: state(fleet, url) is EngineState.READY)
        del answers.bodies["/v1/models"]
        await wait_until(lambda: state(fleet, url) is EngineState.UNHEALTHY)
        failed = answers.sent["/v1/models"]
        await wait_until(
            lambda: answers.sent["/v1/models"] >= failed + 4 * len(b"no"), what="4 more failures"
        )
        answers.bodies["/v1/models"] = MODELS
        await wait_until(lambda: state(fleet, url) is EngineState.READY)
    told = [
        (r.name, r.levelno, r.getMessage().split(": ", 1)[0].replace(url, "E"))
        for r in caplog.records
        if r.name in ("headcount.fleet", "headcount.probe")
    ]
    assert told == [
        ("headcount.fleet", logging.INFO, "engine E added by static at E (pending)"),
        ("headcount.fleet", logging.WARNING, "engine E unhealthy (was pending)"),
        ("headcount.fleet", logging.INFO, "engine E ready (was unhealthy)"),
        ("headcount.probe", logging.WARNING, "engine E failed a probe (ready)"),
        ("headcount.fleet", logging.WARNING, "engine E unhealthy (was ready)"),
        ("headcount.fleet", logging.INFO, "engine E ready (was unhealthy)"),
    ]
