"""The registry of engine indexes: it follows the fleet, and each engine's stream moves its trust.

Subscribers are fakes that hand over their sink, so a test plays the stream's
part (connected, batches, gaps, clears) on a fake clock, and plays the
engine's scrape through the fleet's `apply_probe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import AsyncIterator

import pytest

from headcount.fleet import Fleet, ProbeResult
from headcount.fleet.vllm_load import VllmLoad
from headcount.kvevents import BlockRemoved, BlockStored, EventBatch, KvEvent
from headcount.kvindex.index import BLOCK_BYTES
from headcount.kvindex.keys import block_keys
from headcount.kvindex.memory import TIDY_SLICE
from headcount.kvindex.registry import KvIndexes
from headcount.kvindex.stream import ClearReason, StreamSink, SubscriberTarget
from headcount.kvindex.trust import IndexTrust
from tests.support import FakeClock, spec, wait_until

__all__: list[str] = []

BLOCK = 4
PROMPT = list(range(16))


class FakeSubscriber:
    """Stands for one engine's subscriber: runs until cancelled; `crash` makes the next raise."""

    started: list[FakeSubscriber] = []
    crash = False

    def __init__(self, target: SubscriberTarget, sink: StreamSink) -> None:
        self.target, self.sink = target, sink
        self.cancelled = False
        self.failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run(self) -> None:
        FakeSubscriber.started.append(self)
        if FakeSubscriber.crash:
            FakeSubscriber.crash = False
            raise RuntimeError("boom")
        try:
            await self.failure
        finally:
            self.cancelled = True

    def fail(self) -> None:
        """Make the running subscriber raise, as a decoder bug would."""
        self.failure.set_exception(RecursionError("maximum recursion depth exceeded"))


@contextlib.asynccontextmanager
async def following_a(
    idle_timeout: float = 3600.0, **bounds: int
) -> AsyncIterator[tuple[Fleet, KvIndexes, FakeClock]]:
    """Indexes with fake subscribers (with `bounds`: `max_bytes`...) following a fleet of
    engine a, on a fake clock; closed on exit. Streams stay confirmed for `idle_timeout`
    (an hour: the tests of other doubts need not play the liveness check)."""
    FakeSubscriber.started = []
    clock = FakeClock()
    fleet = Fleet(unhealthy_after=1, clock=clock)
    indexes = KvIndexes(
        fleet,
        subscriber=FakeSubscriber,
        port=5557,
        replay_port=5558,
        topic="",
        idle_timeout=idle_timeout,
        replay_timeout=2.0,
        clock=clock,
        rebuild_window=30.0,
        check_window=30.0,
        tick=3600.0,
        **bounds,
    )
    fleet.reconcile("static", [spec("a", url="http://10.0.0.1:8000")])
    indexes.start()
    try:
        yield fleet, indexes, clock
    finally:
        await indexes.close()


@pytest.fixture
async def world() -> AsyncIterator[tuple[Fleet, KvIndexes, FakeClock]]:
    async with following_a() as world:
        yield world


async def subscriber_of(engine_url_host: str) -> FakeSubscriber:
    async def started() -> bool:
        return any(engine_url_host in s.target.endpoint for s in FakeSubscriber.started)

    await wait_until(started, timeout=5, what=f"a subscriber for {engine_url_host}")
    return next(s for s in FakeSubscriber.started if engine_url_host in s.target.endpoint)


async def engine_a_connected() -> StreamSink:
    """Engine a's sink, its publisher reached and confirmed, nothing sent yet."""
    sink = (await subscriber_of("10.0.0.1")).sink
    sink.connected(True)
    sink.confirmed(None)
    return sink


async def engine_a_holding_the_prompt() -> StreamSink:
    """Engine a's sink, connected, after a batch that stored the prompt's 4 blocks."""
    sink = await engine_a_connected()
    sink.batch(0, batch(STORE))
    return sink


def batch(*events: KvEvent) -> EventBatch:
    return EventBatch(0.0, list(events))


STORE = BlockStored([1, 2, 3, 4], None, PROMPT, BLOCK)
KEYS = block_keys(PROMPT, BLOCK, None)


async def test_each_engine_gets_a_subscriber_on_its_host_with_annotated_or_default_ports(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    fleet, _, _ = world
    fleet.upsert(spec("b", url="http://[fd00::2]:8000", kv_events_port=6000))
    a, b = await subscriber_of("10.0.0.1"), await subscriber_of("fd00::2")
    assert a.target == SubscriberTarget("tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558", "", 2.0)
    assert (b.target.endpoint, b.target.replay_endpoint) == (
        "tcp://[fd00::2]:6000",
        "tcp://[fd00::2]:5558",
    )


async def test_a_removed_engine_leaves_nothing_behind(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    fleet, indexes, _ = world
    a = await subscriber_of("10.0.0.1")
    a.sink.connected(True)
    a.sink.batch(0, batch(STORE))
    answered(indexes, 12)
    assert indexes.match("a", KEYS) == 4
    fleet.reconcile("static", [])
    await wait_until(lambda: _true(a.cancelled), timeout=5, what="the subscriber cancelled")
    assert indexes.views() == {}
    assert indexes.match("a", KEYS) is None
    assert indexes.block_size("a") is None
    assert indexes._engines == {}


async def test_new_ports_mean_a_new_subscriber_and_an_empty_index(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    fleet, indexes, _ = world
    old = await subscriber_of("10.0.0.1")
    old.sink.connected(True)
    old.sink.batch(0, batch(STORE))
    fleet.upsert(spec("a", url="http://10.0.0.1:8000", kv_events_port=7000))
    indexes.tick()
    new = await subscriber_of(":7000")
    await wait_until(lambda: _true(old.cancelled), timeout=5, what="the old one cancelled")
    new.sink.connected(True)
    new.sink.confirmed(None)
    assert indexes.match("a", KEYS) == 0


async def test_events_build_the_index_and_routing_reads_it_while_usable(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    _, indexes, _ = world
    sink = (await subscriber_of("10.0.0.1")).sink
    assert indexes.match("a", KEYS) is None  # off: no publisher yet
    sink.connected(True)
    sink.batch(0, batch(STORE, BlockRemoved([3])))
    assert indexes.match("a", KEYS) == 2
    assert indexes.block_size("a") == BLOCK
    view = indexes.view("a")
    assert view is not None
    assert (view.trust, view.blocks, view.events_applied) == (IndexTrust.SYNCED, 3, 2)


async def test_trust_follows_the_stream_s_confirmations_never_the_traffic() -> None:
    async with following_a(idle_timeout=10.0) as (_, indexes, clock):
        sink = await engine_a_holding_the_prompt()
        for _ in range(3):  # answered from the cache: no event, no doubt
            answered(indexes, 12)
            clock.now += 9
            indexes.tick()
            assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.SYNCED, 4)
            sink.confirmed(0)
        sink.unconfirmed("no answer to the liveness check within 2s")
        clock.now += 9
        indexes.tick()
        assert _trust(indexes) is IndexTrust.SYNCED
        clock.now += 1
        indexes.tick()
        view = indexes.view("a")
        assert view is not None
        assert (view.trust, view.reason) == (
            IndexTrust.STALE,
            "not confirmed for 10s: no answer to the liveness check within 2s",
        )
        assert indexes.match("a", KEYS) is None
        sink.confirmed(0)
        assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.SYNCED, 4)
        clock.now += 10
        sink.batch(1, batch())
        assert _trust(indexes) is IndexTrust.SYNCED


async def test_a_session_is_off_until_confirmed_and_the_change_says_how(
    world: tuple[Fleet, KvIndexes, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="headcount.kvindex.registry")
    _, indexes, _ = world
    sink = (await subscriber_of("10.0.0.1")).sink
    sink.connected(True)
    view = indexes.view("a")
    assert view is not None and view.trust is IndexTrust.OFF
    assert view.reason == (
        "connected to tcp://10.0.0.1:5557, not yet confirmed: "
        "waiting for a batch or an answer to the liveness check"
    )
    assert not [r for r in caplog.records if "->" in r.getMessage()]
    sink.confirmed(None)
    assert [r.getMessage() for r in caplog.records if "->" in r.getMessage()] == [
        "kv index of a: off -> synced (the publisher has sent no batch: an empty cache)"
    ]


async def test_a_publisher_not_reached_is_logged_once_per_absence(
    world: tuple[Fleet, KvIndexes, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="headcount.kvindex.registry")
    _, indexes, clock = world
    sink = (await subscriber_of("10.0.0.1")).sink

    def unreached() -> list[str]:
        return [r.getMessage() for r in caplog.records if "for 3600s" in r.getMessage()]

    clock.now += 3599
    indexes.tick()
    assert unreached() == []
    clock.now += 1
    indexes.tick()
    clock.now += 3600
    indexes.tick()
    assert unreached() == [
        "kv index of a: no publisher reached at tcp://10.0.0.1:5557 for 3600s (is vLLM's "
        "--kv-events-config publishing there?); routed by load"
    ]
    assert caplog.records[-1].levelno == logging.WARNING
    sink.connected(True)
    sink.connected(False)
    clock.now += 3600
    indexes.tick()
    assert unreached()[1:] == [
        "kv index of a: lost the publisher at tcp://10.0.0.1:5557 for 3600s (is vLLM's "
        "--kv-events-config publishing there?); routed by load"
    ]


async def test_a_gap_rebuilds_and_one_the_replay_cannot_fill_clears_then_heals(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    _, indexes, clock = world
    sink = await engine_a_holding_the_prompt()
    sink.gap(1, 5)
    assert _trust(indexes) is IndexTrust.REBUILDING
    assert indexes.match("a", KEYS) == 4  # rebuilding: true, maybe incomplete, still used
    sink.replayed(False)
    assert _trust(indexes) is IndexTrust.REBUILDING  # not synced for a moment in between
    sink.clear(ClearReason.GAP)
    view = indexes.view("a")
    assert view is not None and view.blocks == 0
    assert view.reason == "rebuilding for 0s: cleared, the replay could not fill the gap 1..4"
    assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.REBUILDING, 4)  # hints
    clock.now += 29
    indexes.tick()
    assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.REBUILDING, 4)
    clock.now += 1
    indexes.tick()
    assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.SYNCED, 0)
    view = indexes.view("a")
    assert view is not None
    assert (view.gaps, view.replays_failed, view.clears[ClearReason.GAP]) == (1, 1, 1)


async def test_a_restart_empties_the_index_and_leaves_it_synced(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    _, indexes, _ = world
    sink = await engine_a_holding_the_prompt()
    sink.clear(ClearReason.RESTART)
    assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.SYNCED, 0)


async def test_a_restart_during_a_gap_rebuilds_until_the_replay_ends(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    _, indexes, _ = world
    sink = await engine_a_connected()
    sink.gap(0, 3)
    sink.clear(ClearReason.RESTART)
    assert _trust(indexes) is IndexTrust.REBUILDING
    sink.replayed(True)
    assert _trust(indexes) is IndexTrust.SYNCED


async def test_a_lost_publisher_is_off_until_it_is_reached_again(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    _, indexes, _ = world
    sink = await engine_a_holding_the_prompt()
    sink.connected(False)
    assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.OFF, None)
    view = indexes.view("a")
    assert view is not None and view.reason == "lost the publisher at tcp://10.0.0.1:5557"
    sink.connected(True)
    assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.OFF, None)
    sink.confirmed(0)
    assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.SYNCED, 4)


async def test_blocks_after_a_missed_prefix_rebuild_for_a_window_then_sync(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    _, indexes, clock = world
    sink = await engine_a_connected()
    sink.batch(0, batch(BlockStored([9], 77, PROMPT[:BLOCK], BLOCK), STORE))
    assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.REBUILDING, 4)
    clock.now += 20
    sink.batch(1, batch(BlockStored([10], 78, PROMPT[:BLOCK], BLOCK)))
    clock.now += 20
    indexes.tick()
    assert _trust(indexes) is IndexTrust.REBUILDING  # the second one restarted the window
    clock.now += 10
    indexes.tick()
    view = indexes.view("a")
    assert view is not None
    assert (view.trust, view.unknown_parents) == (IndexTrust.SYNCED, 2)


async def test_more_blocks_than_the_engine_advertises_is_an_overflow(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    fleet, indexes, _ = world
    sink = await engine_a_connected()
    fleet.apply_probe("a", ProbeResult(ok=True, load=VllmLoad(kv_capacity_blocks=3)))
    indexes.tick()
    sink.batch(0, batch(STORE))
    view = indexes.view("a")
    assert view is not None
    assert (view.trust, view.blocks, view.capacity) == (IndexTrust.REBUILDING, 0, 3)
    assert view.clears[ClearReason.OVERFLOW] == 1


async def test_hits_below_the_predictions_make_it_stale_until_a_window_agrees(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    fleet, indexes, clock = world
    await engine_a_holding_the_prompt()

    scrape(fleet, indexes, 100)
    for _ in range(8):
        answered(indexes, 12)
    clock.now += 31
    scrape(fleet, indexes, 100 + 96 / 2 - 2 * BLOCK)  # just enough: agrees
    assert _trust(indexes) is IndexTrust.SYNCED
    for _ in range(8):
        answered(indexes, 12)
    clock.now += 31
    scrape(fleet, indexes, 141 + 10)
    view = indexes.view("a")
    assert view is not None and view.trust is IndexTrust.STALE
    assert "the index predicted 96" in view.reason
    assert (view.blocks, view.clears[ClearReason.DISAGREEMENT]) == (0, 1)
    assert indexes.match("a", KEYS) is None
    for _ in range(7):
        answered(indexes, 0)
    clock.now += 31
    scrape(fleet, indexes, 151)
    assert _trust(indexes) is IndexTrust.STALE  # seven requests are no window
    answered(indexes, 0)
    scrape(fleet, indexes, 151)
    assert indexes.match("a", KEYS) == 0  # usable again, and empty
    assert _trust(indexes) is IndexTrust.REBUILDING
    clock.now += 30
    indexes.tick()
    assert _trust(indexes) is IndexTrust.SYNCED
    assert view.predicted_hit_tokens == 192


async def test_once_closed_a_fleet_change_starts_no_subscriber(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    fleet, indexes, _ = world
    a = await subscriber_of("10.0.0.1")
    await indexes.close()
    assert a.cancelled
    fleet.upsert(spec("d", url="http://10.0.0.4:8000"))
    assert indexes.views() == {}  # following an engine starts at once, with its subscriber


async def test_a_crashed_subscriber_is_started_again(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    fleet, _, _ = world
    FakeSubscriber.crash = True
    fleet.upsert(spec("c", url="http://10.0.0.3:8000"))

    async def twice() -> bool:
        return sum("10.0.0.3" in s.target.endpoint for s in FakeSubscriber.started) == 2

    await wait_until(twice, timeout=5, what="the subscriber started again")


async def test_after_a_subscriber_crash_the_index_is_rebuilding_never_synced(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    _, indexes, clock = world
    sink = await engine_a_holding_the_prompt()
    (await subscriber_of("10.0.0.1")).fail()

    async def restarted() -> bool:
        return sum("10.0.0.1" in s.target.endpoint for s in FakeSubscriber.started) == 2

    await wait_until(restarted, timeout=5, what="the subscriber started again")
    sink.connected(True)  # the new subscriber reached the publisher; what it missed is unknown
    sink.confirmed(0)
    view = indexes.view("a")
    assert view is not None
    assert (view.trust, view.blocks, view.clears[ClearReason.GAP]) == (IndexTrust.REBUILDING, 0, 1)
    assert indexes.match("a", KEYS) == 4  # hints, until the rebuild window ends
    clock.now += 30
    indexes.tick()
    assert (_trust(indexes), indexes.match("a", KEYS)) == (IndexTrust.SYNCED, 0)


def scrape(fleet: Fleet, indexes: KvIndexes, hits: float) -> None:
    """Engine a's `/metrics` said `hits` prefix-cache hit tokens; then a tick."""
    fleet.apply_probe("a", ProbeResult(ok=True, load=VllmLoad(prefix_cache_hits=hits)))
    indexes.tick()


def answered(indexes: KvIndexes, predicted: int) -> None:
    """A request routed to engine a, with `predicted` tokens cached, got its first byte."""
    indexes.routed("a", 16, predicted)
    indexes.prefilled("a", predicted)


def _trust(indexes: KvIndexes) -> IndexTrust:
    view = indexes.view("a")
    assert view is not None
    return view.trust


async def _true(value: bool) -> bool:
    return value


async def test_a_hit_counter_going_back_clears_an_index_whose_stream_missed_the_restart(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    fleet, indexes, clock = world
    await engine_a_holding_the_prompt()

    scrape(fleet, indexes, 500)
    clock.now += 5
    scrape(fleet, indexes, 20)
    view = indexes.view("a")
    assert view is not None
    assert (view.trust, view.blocks, view.clears[ClearReason.RESTART]) == (
        IndexTrust.REBUILDING,
        0,
        1,
    )


async def test_a_restart_the_stream_showed_is_not_cleared_again_by_the_counter(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    fleet, indexes, clock = world
    sink = await engine_a_holding_the_prompt()

    scrape(fleet, indexes, 500)
    clock.now += 1
    sink.clear(ClearReason.RESTART)
    sink.batch(0, batch(STORE))
    clock.now += 4
    scrape(fleet, indexes, 20)
    assert indexes.match("a", KEYS) == 4
    assert _trust(indexes) is IndexTrust.SYNCED


async def test_engines_sharing_one_kv_event_endpoint_get_no_stream_and_say_why(
    world: tuple[Fleet, KvIndexes, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 17, finding 12: two engines on one host read one stream, each predicted to hold
    the other's prefixes. The events do not say which engine sent them: neither gets them."""
    fleet, indexes, _ = world
    a = await subscriber_of("10.0.0.1")
    a.sink.connected(True)
    a.sink.batch(0, batch(STORE))
    fleet.upsert(spec("b", url="http://10.0.0.1:8001"))
    indexes.tick()
    for engine, other in (("a", "b"), ("b", "a")):
        assert indexes.match(engine, KEYS) is None
        view = indexes.view(engine)
        assert view is not None
        assert (view.trust, view.blocks, view.memory_limit_bytes) == (IndexTrust.OFF, 0, 0)
        assert view.reason == (
            f"tcp://10.0.0.1:5557 is also {other}'s KV-event endpoint: events not attributed; "
            "give each engine its own kv-events-port annotation"
        )
    await wait_until(lambda: _true(a.cancelled), timeout=5, what="a's subscriber cancelled")
    assert sum("10.0.0.1" in s.target.endpoint for s in FakeSubscriber.started) == 1
    assert "engines a, b share the KV-event endpoint tcp://10.0.0.1:5557" in caplog.text
    fleet.upsert(spec("b", url="http://10.0.0.1:8001", kv_events_port=6000))
    indexes.tick()
    assert "engines a, b share the KV-event endpoint tcp://10.0.0.1:5558" in caplog.text
    fleet.upsert(
        spec("b", url="http://10.0.0.1:8001", kv_events_port=6000, kv_events_replay_port=6001)
    )
    indexes.tick()
    await subscriber_of(":6000")

    async def a_again() -> bool:
        return sum(s.target.endpoint.endswith(":5557") for s in FakeSubscriber.started) == 2

    await wait_until(a_again, timeout=5, what="a subscriber for a again")


@pytest.fixture
async def bounded() -> AsyncIterator[tuple[Fleet, KvIndexes]]:
    """Engine a, its index bounded to 6 blocks, and to an equal share of 10 with others."""
    bounds = {"max_bytes": 10 * BLOCK_BYTES, "max_bytes_per_engine": 6 * BLOCK_BYTES}
    async with following_a(**bounds) as (fleet, indexes, _):
        yield fleet, indexes


async def test_the_memory_bounds_share_out_bytes_and_an_engine_at_its_share_stops_adding(
    bounded: tuple[Fleet, KvIndexes],
) -> None:
    """Issue 17, finding 4: an engine advertising 10**17 blocks grew the router by 1.7 GiB."""
    fleet, indexes = bounded
    sink = await engine_a_connected()
    sink.batch(0, batch(STORE, BlockStored([5, 6, 7], 4, list(range(16, 28)), BLOCK)))
    view = indexes.view("a")
    assert view is not None
    assert (view.blocks, view.refused_blocks, view.trust) == (6, 1, IndexTrust.REBUILDING)
    assert (view.memory_bytes, view.memory_limit_bytes) == (6 * BLOCK_BYTES, 6 * BLOCK_BYTES)
    assert view.reason == "over its memory bound of 0.0 MiB (6 blocks): new blocks not indexed"
    sink.clear(ClearReason.GAP)
    sink.batch(1, batch(BlockStored([8], None, [9, 9, 9, 9], BLOCK)))
    view = indexes.view("a")
    assert view is not None
    assert (view.blocks, view.hints, view.refused_blocks) == (0, 6, 2)  # hints count
    assert view.memory_bytes == 6 * BLOCK_BYTES
    fleet.upsert(spec("b", url="http://10.0.0.2:8000"))
    indexes.tick()
    for engine in ("a", "b"):
        view = indexes.view(engine)
        assert view is not None and view.memory_limit_bytes == 5 * BLOCK_BYTES
    await a_freed(indexes)  # its hints, over its new share
    assert indexes.match("a", KEYS) == 0


async def a_freed(indexes: KvIndexes) -> None:
    """Until engine a's index is charged nothing: what it dropped was freed."""

    async def freed() -> bool:
        view = indexes.view("a")
        return view is not None and view.memory_bytes == 0

    await wait_until(freed, timeout=5, what="engine a's dropped blocks freed")


async def test_an_index_over_a_share_that_shrank_is_cleared_and_rebuilds(
    bounded: tuple[Fleet, KvIndexes],
) -> None:
    fleet, indexes = bounded
    sink = await engine_a_connected()
    sink.batch(0, batch(STORE, BlockStored([5, 6], 4, list(range(16, 24)), BLOCK)))
    fleet.upsert(spec("b", url="http://10.0.0.2:8000"))
    indexes.tick()
    view = indexes.view("a")
    assert view is not None
    assert (view.trust, view.blocks, view.memory_limit_bytes) == (
        IndexTrust.REBUILDING,
        0,
        5 * BLOCK_BYTES,
    )
    assert view.reason == (
        "rebuilding for 0s: cleared, over its share of memory (5 blocks) after engines were added"
    )
    await a_freed(indexes)  # what is being freed counts until it is
    sink.batch(1, batch(STORE))
    assert indexes.match("a", KEYS) == 4


async def test_a_removed_engines_index_is_freed_a_slice_at_a_time(
    world: tuple[Fleet, KvIndexes, FakeClock],
) -> None:
    """Issue 17, finding 3: freeing millions of blocks at once stalls the loop as copying does."""
    fleet, _, _ = world
    sink = await engine_a_connected()
    blocks = 3 * TIDY_SLICE
    sink.batch(0, batch(BlockStored(list(range(1, blocks + 1)), None, list(range(blocks)), 1)))
    gc.collect()
    before = sys.getallocatedblocks()
    fleet.reconcile("static", [])
    assert abs(sys.getallocatedblocks() - before) < 1000

    async def freed() -> bool:
        return sys.getallocatedblocks() < before - blocks  # two ints a block, at least

    await wait_until(freed, timeout=5, what="the removed engine's index freed")
