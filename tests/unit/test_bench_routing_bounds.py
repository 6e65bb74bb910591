"""The bounds beside each router's hits: the best fixed assignment, and the miss breakdown."""

from __future__ import annotations

import itertools
import random

from bench.routing.assignment import best_fixed_assignment
from bench.routing.cache_model import Access, fleet_hits
from bench.routing.misses import breakdown, seen_before
from bench.routing.trace import RunTrace, Schedule

_A = Access((1, 2), 2)
_B = Access((3, 4), 2)


def _schedule(accesses: list[Access], tokens: int = 40) -> Schedule:
    count = len(accesses)
    return Schedule((), tuple(accesses), (tokens,) * count, (True,) * count)


def test_seen_before_counts_the_leading_blocks_an_earlier_request_asked_for() -> None:
    assert seen_before([_A, Access((1, 5), 2), _A, _B]) == [0, 1, 2, 0]


def test_every_missed_token_is_compulsory_capacity_or_routing() -> None:
    # 40-token prompts: 2 cacheable blocks and 8 tokens never cacheable.
    schedule = _schedule([_A, _A, _B, _A, _A])
    trace = RunTrace(schedule, (0, 1, 0, 0, 1), (0, 0, 0, 32, 0), 0)
    pooled = [0, 2, 0, 2, 1]
    split = breakdown(trace, pooled, 16)
    assert split.queried == 200 and split.hits == 32
    # r0, r2: first asks (40 each); every request: 8 tail tokens.
    assert split.compulsory == 40 + 8 + 40 + 8 + 8
    # r1: the pooled bound hit both blocks its engine missed; r4: its first block only.
    assert split.routing == 32 + 16
    assert split.capacity == 16
    assert split.hits + split.compulsory + split.capacity + split.routing == split.queried


def test_the_breakdown_counts_only_measured_answered_requests() -> None:
    schedule = Schedule((), (_A, _A, _A), (40,) * 3, (False, True, True))
    trace = RunTrace(schedule, (0, None, 0), (0, None, 32), 0)
    split = breakdown(trace, [0, 2, 2], 16)
    assert (split.queried, split.hits, split.compulsory, split.routing) == (40, 32, 8, 0)


def _alternating(count: int) -> tuple[list[Access], list[int]]:
    accesses = [_A if i % 2 == 0 else _B for i in range(count)]
    return accesses, [i % 2 for i in range(count)]


def test_the_best_fixed_assignment_gives_each_tenant_its_own_engine_when_one_holds_one() -> None:
    accesses, tenants = _alternating(20)
    placement = best_fixed_assignment(
        accesses, [True] * 20, tenants, list(range(20)), engines=2, capacity=2, seed=1
    )
    assert placement.violation == 0
    assert sorted(placement.homes) == [(0,), (1,)]
    assert placement.hit_blocks == 2 * 18
    assert placement.loads == (10, 10)


def test_a_tenant_too_busy_for_one_engine_within_the_load_bound_is_copied() -> None:
    # Tenant 0 sends 3 of every 4 requests; each engine may carry 50 % +- 10 %.
    accesses = [_B if i % 4 == 3 else _A for i in range(40)]
    tenants = [1 if i % 4 == 3 else 0 for i in range(40)]
    placement = best_fixed_assignment(
        accesses, [True] * 40, tenants, list(range(40)), engines=2, capacity=2, seed=1
    )
    assert placement.violation == 0
    assert sorted(placement.homes[0]) == [0, 1]
    assert all(18 <= load <= 22 for load in placement.loads)


def test_the_local_search_reaches_the_best_single_home_layout_found_by_enumeration() -> None:
    rng = random.Random(0)
    sizes = [3, 3, 2, 2, 1, 1]
    tenants = [rng.choices(range(6), [6, 5, 4, 3, 2, 1])[0] for _ in range(120)]
    accesses = [Access(tuple(10 * t + k for k in range(sizes[t])), sizes[t]) for t in tenants]
    best = 0
    for layout in itertools.product(range(2), repeat=6):
        engines = [layout[t] for t in tenants]
        if all(54 <= engines.count(e) <= 66 for e in range(2)):
            best = max(best, sum(fleet_hits(accesses, engines, 5)))
    placement = best_fixed_assignment(
        accesses, [True] * 120, tenants, list(range(120)), engines=2, capacity=5, seed=1
    )
    assert placement.violation == 0
    assert placement.hit_blocks >= best > 0
