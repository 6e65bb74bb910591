"""Proves the stall watch through the real proxy: requests leave an engine that stopped answering.

A cached engine that stops answering completions while its probes pass (the
simulator's `stall` mode) no longer draws every `kv-aware` request until the
read timeout: the policy counts what waits on it, the waiting requests fail
over once it has sent no first byte for `--stalled-engine-timeout`, and it is
ejected (on heads alone without a prober; with one, because its scraped token
counters stood still too). An engine that is slow but still answering others
is left alone, and so is one generating a long unstreamed answer, whose head
comes only when it is done, while its token counters move.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest

from headcount.config import OutlierSettings, ProbeSettings
from headcount.fleet import Fleet
from headcount.probe import Prober
from headcount.tokens import builtin_tokenizer
from tests.support import wait_until
from tests.support.kv_event_index import EventIndex
from tests.support.kv_routed import BS, ENGINES, QUESTIONS, ask, kv_policy, record
from tests.support.routed import CHAT, SETTINGS, chat, routed, sim

STALL = 1.0
"""The stall bound here: a request waits at most 1.5 x this, well under the read timeout."""
WATCHED = dataclasses.replace(SETTINGS, stalled_engine_timeout=STALL)
PROBES = ProbeSettings(interval=0.2)
"""Scrapes every engine's `/metrics` 5 times a stall bound."""


@contextlib.asynccontextmanager
async def probing(fleet: Fleet, on: bool = True) -> AsyncIterator[None]:
    """The real prober over `fleet` for the block (`on`), so loads carry what engines say."""
    task = asyncio.create_task(Prober(fleet, PROBES).run()) if on else None
    try:
        if task is not None:
            await wait_until(
                lambda: all(e.load.kv_usage is not None for e in fleet.snapshot.engines),
                what="every engine scraped",
            )
        yield
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("probed", [False, True], ids=["heads-alone", "token-counters"])
async def test_kv_aware_requests_move_off_a_cached_engine_that_stopped_answering(
    probed: bool,
) -> None:
    """Issue 17 finding 11: all 8 clients waited the whole read timeout on the hung engine."""
    index = EventIndex(BS)
    policy = kv_policy(index, builtin_tokenizer())
    async with (
        routed(*ENGINES[:2], policy=policy, settings=WATCHED) as setup,
        probing(setup.fleet, probed),
    ):
        record(setup, index)
        status, _, headers = await setup.post(CHAT, ask(QUESTIONS[0]))
        assert status == 200
        warm = headers["x-engine-name"]
        [hung] = [engine for engine in setup.engines if engine.name == warm]
        await hung.set_fail_mode("stall")
        loop = asyncio.get_running_loop()
        started = loop.time()
        answers = await asyncio.gather(
            *(setup.post(CHAT, ask(f"{QUESTIONS[1]} {n}")) for n in range(8))
        )
        elapsed = loop.time() - started
        assert [status for status, _, _ in answers] == [200] * 8
        assert all(headers["x-engine-name"] != warm for _, _, headers in answers)
        assert elapsed < SETTINGS.read_timeout, "moved, not timed out"
        snapshot = setup.fleet.snapshot  # engine ids are their URLs
        # What waits on it counts against its cache: a burst splits over both engines (each
        # one's queue counts alike), instead of all 8 waiting on the cached one.
        assert snapshot.by_id[hung.url].load.requests - 1 < 8
        assert hung.url in snapshot.ejected
        counted = snapshot.by_id[hung.url].load.progress is not None
        assert counted is probed, "probed: stalled for its token counters standing still too"
        assert setup.sample("headcount_outlier_ejections_total", reason="stalled") == 1
        assert setup.sample("headcount_upstream_failovers_total", reason="engine_stalled") >= 1
        await hung.set_fail_mode("none")
        await wait_until(setup.all_released)
        assert [engine.load.awaiting for engine in setup.fleet.snapshot.engines] == [0, 0]


async def test_an_engine_answering_others_is_not_stalled_by_one_long_request() -> None:
    slow = sim("slow", token_delay=0.05)
    outliers = OutlierSettings(consecutive_errors=1)
    async with routed(slow, settings=WATCHED, outliers=outliers) as setup:
        long = asyncio.ensure_future(setup.post(CHAT, chat(max_tokens=int(3 * STALL / 0.05))))
        short = 0
        while not long.done() and short < 200:
            status, _, _ = await setup.post(CHAT, chat(max_tokens=2))
            assert status == 200
            short += 1
        status, body, _ = await long
        assert status == 200 and body["usage"]["completion_tokens"] == int(3 * STALL / 0.05)
        assert short > 10
        assert setup.fleet.snapshot.ejected == frozenset()
        assert setup.sample("headcount_upstream_failovers_total", reason="engine_stalled") == 0
        await wait_until(setup.all_released)


async def test_an_engine_generating_a_long_unstreamed_answer_keeps_it_and_stays_in_rotation() -> (
    None
):
    """Issue 17 finding 11, the watchdog's own flaw: vLLM sends an unstreamed answer's head
    when the whole answer is done, so a batch job's 80 s answers looked like a hung engine:
    each moved (to take as long on the next engine, ejected in turn) and the engine was
    ejected. Its token counters, scraped meanwhile, say it is working."""
    delay = 0.01
    tokens = int(3 * STALL / delay)  # 3 s with no head: three stall bounds
    engines = sim("batch-a", token_delay=delay), sim("batch-b", token_delay=delay)
    outliers = OutlierSettings(consecutive_errors=1)
    async with (
        routed(*engines, settings=WATCHED, outliers=outliers) as setup,
        probing(setup.fleet),
    ):
        status, body, _ = await setup.post(CHAT, chat(max_tokens=tokens))
        assert status == 200 and body["usage"]["completion_tokens"] == tokens
        assert setup.sample("headcount_upstream_failovers_total", reason="engine_stalled") == 0
        assert setup.fleet.snapshot.ejected == frozenset()
        assert sorted(load[1] for load in setup.loads()) == [0, 1], "one attempt, not moved"
        await wait_until(setup.all_released)
