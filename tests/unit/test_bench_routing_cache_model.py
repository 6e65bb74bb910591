"""The offline cache model: LRU per engine as the simulator's block pool, and Belady's bound."""

from __future__ import annotations

from bench.routing.cache_model import Access, belady_hits, fleet_hits, lru_hits


def _one(block: int) -> Access:
    return Access((block,), 1)


def test_lru_keeps_the_most_recently_used_blocks_and_a_prompts_first_blocks_last() -> None:
    # r1 = a b, r2 = c d, r3 = a b; 3 blocks: r2 evicts b (r1's tail goes first), so r3
    # finds a only.
    trace = [Access((1, 2), 2), Access((3, 4), 2), Access((1, 2), 2)]
    assert lru_hits(trace, 3) == [0, 0, 1]
    assert lru_hits(trace, 4) == [0, 0, 2]


def test_a_hit_is_the_leading_run_of_cached_blocks_up_to_the_limit() -> None:
    assert lru_hits([Access((1, 2, 3), 3), Access((1, 2, 3), 2)], 10) == [0, 2]
    # 9 evicts 3, the chain's tail: the last request finds 1 and 2.
    trace = [Access((1, 2, 3), 3), Access((9,), 1), Access((1,), 1), Access((1, 2, 3), 3)]
    assert lru_hits(trace, 3) == [0, 0, 1, 2]
    assert lru_hits(trace, 2) == [0, 0, 1, 1]


def test_output_blocks_take_room_and_go_before_the_prompt() -> None:
    trace = [Access((1,), 1, output_blocks=2), Access((2,), 1), Access((1,), 1)]
    assert lru_hits(trace, 2) == [0, 0, 1]
    assert lru_hits([Access((1,), 1, output_blocks=2), _one(2), _one(3), _one(1)], 2) == [
        0,
        0,
        0,
        0,
    ]


def test_belady_beats_lru_where_lru_evicts_what_comes_back_first() -> None:
    trace = [_one(1), _one(2), _one(3), _one(1), _one(2)]
    assert lru_hits(trace, 2) == [0, 0, 0, 0, 0]
    assert belady_hits(trace, 2) == [0, 0, 0, 1, 1]


def test_belady_keeps_a_whole_prefix_and_drops_blocks_never_used_again() -> None:
    trace = [Access((1, 2), 2), Access((3, 4), 2), Access((1, 2), 2)]
    assert belady_hits(trace, 2) == [0, 0, 2]
    # Room for one block: the chain's first one stays (the deeper goes on a tie).
    assert belady_hits(trace, 1) == [0, 0, 1]


def test_belady_evicts_the_block_used_furthest_in_the_future() -> None:
    trace = [_one(1), _one(2), _one(3), _one(2), _one(3), _one(1)]
    assert belady_hits(trace, 2) == [0, 0, 0, 1, 1, 0]
    assert belady_hits(trace, 3) == [0, 0, 0, 1, 1, 1]


def test_belady_never_hits_less_than_lru() -> None:
    trace = [_one(b % 7) for b in range(40)] + [Access((1, 2, 3), 3)] * 3
    for capacity in (2, 4, 6):
        assert sum(belady_hits(trace, capacity)) >= sum(lru_hits(trace, capacity))


def test_the_fleet_replays_each_request_on_its_own_engines_cache() -> None:
    trace = [_one(1), _one(2), _one(1), _one(2)]
    assert fleet_hits(trace, [0, 1, 0, 1], 1) == [0, 0, 1, 1]
    assert fleet_hits(trace, [0, 0, 0, 0], 1) == [0, 0, 0, 0]
    assert fleet_hits(trace, [0, 1, 1, 0], 1) == [0, 0, 0, 0]
