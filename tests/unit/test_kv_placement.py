"""Proves kv-aware's placement plan over hand-built snapshots, and the stream that builds it.

The planner (`plan_placement`): a group one engine cannot carry gets two
homes; the tail goes to the spill engines; capacity is respected; a plan
keeps its homes when a new one would be only a little better (hysteresis);
overflow adds a copy, and a spill engine; the same snapshot in any order
gives the same plan. The traffic (`PrefixTraffic`): a group's head is what
its requests share; counts decay. The stream (`Placement`): no plan on a
stale index or an unknown cache size; a plan too old is not used; it re-plans
every interval until closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from headcount.fleet import Engine
from headcount.routing.kv.placement import (
    EngineRoom,
    PlacementSettings,
    Plan,
    PrefixGroup,
    plan_placement,
)
from headcount.routing.kv.planning import Placement
from headcount.routing.kv.traffic import PrefixTraffic, group_key
from tests.support import engine, ready_fleet, spec, wait_until
from tests.support.clock import FakeClock

SETTINGS = PlacementSettings(fill=1.0, min_requests=1.0)


def rooms(*blocks: int) -> list[EngineRoom]:
    return [EngineRoom(f"e{index}", size) for index, size in enumerate(blocks)]


def group(key: int, rate: float, blocks: int = 10, overflow: float = 0.0) -> PrefixGroup:
    return PrefixGroup(key, blocks, rate, blocks + 1.0, overflow)


def tail(count: int = 10, blocks: int = 10) -> list[PrefixGroup]:
    """Groups too cold to home (under `min_requests`)."""
    return [group(100 + key, 0.5, blocks) for key in range(count)]


def test_a_group_one_engine_cannot_carry_gets_two_homes_and_the_others_one() -> None:
    groups = [group(1, 40.0), *(group(key, 10.0) for key in range(2, 6)), *tail()]
    plan = plan_placement(groups, rooms(100, 100, 100, 100), None, SETTINGS)
    # 85 requests over 4 engines within 10 %: 23.4 an engine at most, 40 needs two
    assert len(plan.homes[1]) == 2
    assert [len(plan.homes[key]) for key in (2, 3, 4)] == [1, 1, 1]


def test_the_tail_goes_to_one_spill_engine_and_only_hot_groups_have_homes() -> None:
    groups = [group(1, 40.0), *(group(key, 10.0) for key in range(2, 6)), *tail()]
    plan = plan_placement(groups, rooms(100, 100, 100, 100), None, SETTINGS)
    assert plan.spill == ("e0",)
    assert set(plan.homes) <= {1, 2, 3, 4, 5}


def test_no_engine_is_given_more_homed_blocks_than_its_cache_holds() -> None:
    groups = [group(key, 10.0 - key / 10, blocks=30) for key in range(1, 20)]
    engines = rooms(100, 70, 64, 200)
    settings = PlacementSettings(fill=0.9, min_requests=1.0, load_slack=10.0)
    plan = plan_placement(groups, engines, None, settings)
    for room in engines:
        held = sum(30 for homes in plan.homes.values() if room.id in homes)
        assert held <= room.blocks * 0.9, room
    # hottest first: the homed groups are the hottest ones
    assert sorted(plan.homes) == list(range(1, len(plan.homes) + 1))
    assert len(plan.homes) >= 9


def test_homes_stay_when_a_new_plan_would_be_only_a_little_better() -> None:
    engines = rooms(100, 100)  # one 60-block group fits on each
    first = plan_placement(
        [group(1, 10.0, 60), group(2, 9.0, 60), *tail(10, 60)], engines, None, SETTINGS
    )
    assert first.homes == {1: ("e0",)} and first.spill == ("e1",)
    warmer = [group(1, 10.0, 60), group(2, 11.0, 60), *tail(10, 60)]
    assert plan_placement(warmer, engines, first, SETTINGS).homes == {1: ("e0",)}
    assert plan_placement(warmer, engines, None, SETTINGS).homes == {2: ("e0",)}
    hotter = [group(1, 10.0, 60), group(2, 13.0, 60), *tail(10, 60)]
    assert plan_placement(hotter, engines, first, SETTINGS).homes[2] == ("e0",)


def test_overflow_from_its_homes_adds_a_copy_and_from_the_spill_engines_a_spill_engine() -> None:
    groups = [group(1, 40.0), *(group(key, 10.0) for key in range(2, 6)), *tail()]
    engines = rooms(100, 100, 100, 100)
    first = plan_placement(groups, engines, None, SETTINGS)
    assert len(first.homes[2]) == 1 and len(first.spill) == 1
    overflowing = [group(2, 10.0, overflow=3.0) if g.key == 2 else g for g in groups]
    assert len(plan_placement(overflowing, engines, first, SETTINGS).homes[2]) == 2
    spilled = plan_placement(groups, engines, first, SETTINGS, spill_overflow=1.0)
    assert len(spilled.spill) == 2


def test_the_same_snapshot_in_any_order_gives_the_same_plan() -> None:
    groups = [group(key, float(1 + key % 7), blocks=20 + key % 5) for key in range(40)]
    engines = rooms(150, 150, 150, 150)
    plan = plan_placement(groups, engines, None, SETTINGS)
    again = plan_placement(groups[::-1], engines[::-1], None, SETTINGS)
    assert again == plan
    assert plan.engines == ("e0", "e1", "e2", "e3")


def test_replicas_seeing_the_same_shares_of_the_traffic_reach_the_same_plan() -> None:
    groups = [group(1, 40.0), *(group(key, 10.0) for key in range(2, 6)), *tail()]
    engines = rooms(100, 100, 100, 100)
    plan = plan_placement(groups, engines, None, SETTINGS)
    for scale in (0.5, 1.5):  # a replica that sees half, or 1.5 times, as many requests
        scaled = [PrefixGroup(g.key, g.blocks, g.rate * scale, g.prompt_blocks) for g in groups]
        assert plan_placement(scaled, engines, None, SETTINGS) == plan


def test_a_single_engine_or_no_traffic_plans_nothing_and_spills_to_the_first() -> None:
    assert plan_placement([group(1, 5.0)], rooms(100), None, SETTINGS) == Plan({}, ("e0",), ("e0",))
    assert plan_placement([], rooms(100, 100), None, SETTINGS).homes == {}


def test_a_groups_head_is_what_its_requests_share_and_its_counts_decay() -> None:
    traffic = PrefixTraffic(half_life=10.0)
    system = [11, 12, 13, 14, 15, 16]
    key = traffic.observe([*system, 21, 22], prompt_blocks=8.0)
    assert key == group_key(system) == 14
    assert traffic.observe([*system, 31], prompt_blocks=7.0) == key
    assert traffic.observe([1, 2], prompt_blocks=2.0) == 2  # short: its last block
    assert traffic.observe([], prompt_blocks=0.5) is None
    (only,) = [g for g in traffic.groups() if g.key == key]
    assert (only.blocks, only.rate, only.prompt_blocks) == (6, 2.0, 7.5)
    traffic.overflowed(key)
    traffic.overflowed(None)
    traffic.decay(10.0)
    (only,) = [g for g in traffic.groups() if g.key == key]
    assert (only.rate, only.overflow, traffic.spill_overflow) == (1.0, 0.5, 0.5)
    traffic.decay(100.0)
    assert traffic.groups() == []


def fleet(count: int = 2, **load: object) -> list[Engine]:
    return [
        engine(f"e{index}", kv_capacity_blocks=100, kv_block_size=16, **load)
        for index in range(count)
    ]  # type: ignore[arg-type]


def placed(clock: FakeClock, settings: PlacementSettings = SETTINGS) -> Placement:
    placement = Placement(settings, clock)
    for _ in range(5):
        placement.traffic.observe([1, 2, 3, 4], prompt_blocks=4.0)
    return placement


def test_a_stale_index_gives_no_plan_and_routing_is_greedy() -> None:
    clock = FakeClock()
    placement = placed(clock)
    engines: Sequence[Engine] = fleet()
    placement.rebuild(engines, lambda engine_id: engine_id != "e1")
    assert placement.current() is None
    status = placement.status()
    assert not status.used and "kv index not usable on e1" in status.reason
    placement.rebuild(engines, lambda _: True)
    plan = placement.current()
    assert plan is not None and plan.homes == {4: ("e0", "e1")}  # all the traffic: two homes
    assert placement.status().used and placement.status().homed == 1


def test_no_plan_while_an_engines_cache_size_is_not_scraped() -> None:
    clock = FakeClock()
    placement = placed(clock)
    engines = [*fleet(1), engine("e9", kv_block_size=16)]
    placement.rebuild(engines, lambda _: True)
    assert placement.current() is None
    assert "cache size not scraped yet on e9" in placement.status().reason


def test_a_plan_older_than_its_max_age_is_not_used() -> None:
    clock = FakeClock()
    placement = placed(clock, PlacementSettings(fill=1.0, min_requests=1.0, max_age=6.0))
    placement.rebuild(fleet(), lambda _: True)
    clock.advance(6.0)
    assert placement.current() is not None
    clock.advance(0.5)
    assert placement.current() is None
    assert placement.status().reason == "the plan is too old"


async def test_the_stream_re_plans_every_interval_until_closed() -> None:
    clock = FakeClock()
    fleet = ready_fleet(spec("e0"), spec("e1"), clock=clock)
    for each in fleet.snapshot.routable:
        each.load.kv_capacity_blocks, each.load.kv_block_size = 100, 16
    placement = placed(clock)
    placement.start(fleet, lambda _: True, clock.sleep)
    await wait_until(lambda: len(clock.slept) >= 3, timeout=5.0, what="three rounds")
    assert placement.current() is not None
    assert set(clock.slept) == {SETTINGS.interval}
    await placement.close()
    rounds = len(clock.slept)
    clock.advance(SETTINGS.interval * 5)
    await asyncio.sleep(0)
    assert len(clock.slept) == rounds
