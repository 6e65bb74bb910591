"""Proves the `kv-aware` policy's decisions, without I/O, against a fake cache index.

The warm engine wins; affinity yields to a saturated engine; an engine whose
index is not usable counts nothing cached; a long uncached prompt loses to
queued work elsewhere; an adapter's blocks are not the base model's; KV usage
near full counts against an engine; ties rotate. The request side: what a
dispatch holds in `prefill_queued`, what the index hears, the receipt. With a
placement plan: a request goes to its homes (the tail to the spill engines)
unless they have too much queued or are past the in-flight bound, which counts
as overflow; a plan too old is not used.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from headcount.config import RoutingName
from headcount.kvindex.keys import BlockKey, block_keys
from headcount.routing import RequestFeatures, make_policy
from headcount.routing.kv import KvAware, KvRequest, KvRouting
from headcount.routing.kv.placement import PlacementSettings
from headcount.routing.kv.planning import Placement
from headcount.routing.kv.policy import choose_placed, ttft_cost
from tests.support import engine
from tests.support.clock import FakeClock

BS = 4
MODEL = "m"


class FakeIndex:
    """Per engine: the block keys it holds (None: index not usable) and its block size."""

    def __init__(self) -> None:
        self.held: dict[str, set[BlockKey] | None] = {}
        self.sizes: dict[str, int] = {}
        self.calls: list[tuple[object, ...]] = []

    def hold(self, engine_id: str, ids: Sequence[int], lora: str | None = None) -> None:
        keys = block_keys(ids, self.sizes.get(engine_id, BS), lora)
        self.held.setdefault(engine_id, set()).update(keys)  # type: ignore[union-attr]

    def match(self, engine_id: str, keys: Sequence[BlockKey]) -> int | None:
        held = self.held.get(engine_id, set())
        if held is None:
            return None
        count = 0
        for key in keys:
            if key not in held:
                break
            count += 1
        return count

    def block_size(self, engine_id: str) -> int | None:
        return self.sizes.get(engine_id, BS)

    def routed(self, engine_id: str, prompt_tokens: int, predicted_cached_tokens: int) -> None:
        self.calls.append(("routed", engine_id, prompt_tokens, predicted_cached_tokens))

    def prefilled(self, engine_id: str, predicted_cached_tokens: int) -> None:
        self.calls.append(("prefilled", engine_id, predicted_cached_tokens))


def policy(index: FakeIndex, epsilon: float = 0.5) -> KvAware:
    return KvAware(KvRouting(index=index, tokenizer=None), epsilon=epsilon)


def features(kv: KvAware, ids: Sequence[int] | None, model: str = MODEL) -> RequestFeatures:
    return RequestFeatures(model, None, kv.request(model, ids))


PROMPT = list(range(100, 200))  # 25 blocks


def test_the_engine_holding_the_prefix_wins_over_idle_cold_ones() -> None:
    index = FakeIndex()
    engines = [engine("a"), engine("b"), engine("c")]
    index.hold("b", PROMPT[:80])
    kv = policy(index)
    for _ in range(5):
        request = features(kv, PROMPT)
        assert kv.select(engines, request) is engines[1]
        assert request.kv is not None and request.kv.predicted == {"a": 0, "b": 80, "c": 0}


def test_affinity_yields_when_the_warm_engine_is_saturated() -> None:
    index = FakeIndex()
    engines = [engine("a", in_flight=1), engine("b", in_flight=30), engine("c", in_flight=1)]
    index.hold("b", PROMPT)  # bound: ceil(1.5 x 33 / 3) + 8 = 25 in flight
    chosen = policy(index, epsilon=0.5).select(engines, features(policy(index), PROMPT))
    assert chosen is not None and chosen.id in ("a", "c")


def test_a_few_more_in_flight_do_not_move_a_prompt_off_its_cache() -> None:
    index = FakeIndex()
    engines = [engine("a", in_flight=1), engine("b", in_flight=9), engine("c", in_flight=1)]
    index.hold("b", PROMPT)
    kv = policy(index, epsilon=0.5)
    assert kv.select(engines, features(kv, PROMPT)) is engines[1]


def test_a_miss_counts_four_times_so_a_prompt_stays_where_it_is_cached() -> None:
    index = FakeIndex()
    index.hold("a", PROMPT[:40])  # a saves 40 of 100 tokens, but has 150 more queued
    engines = [engine("a", prefill_queued=150), engine("b")]
    kv = policy(index)
    assert kv.select(engines, features(kv, PROMPT)) is engines[0]  # 60 + 150 + 3 x 60 < 4 x 100


def test_when_every_engine_is_over_the_bound_the_best_one_still_takes_it() -> None:
    index = FakeIndex()
    engines = [engine("a", in_flight=5), engine("b", in_flight=5)]
    index.hold("b", PROMPT)
    kv = policy(index, epsilon=0.0)
    assert kv.select(engines, features(kv, PROMPT)) is engines[1]


def test_an_engine_whose_index_is_not_usable_counts_nothing_cached() -> None:
    index = FakeIndex()
    engines = [engine("a", prefill_queued=10), engine("b")]
    index.hold("a", PROMPT)
    index.held["a"] = None  # stale: what it says is not trusted
    kv = policy(index)
    request = features(kv, PROMPT)
    assert kv.select(engines, request) is engines[1]
    assert request.kv is not None and request.kv.predicted["a"] == 0


def test_a_cached_prefix_loses_to_less_queued_prefill_elsewhere() -> None:
    index = FakeIndex()
    index.hold("a", PROMPT[:40])  # saves 40 tokens of 100
    kv = policy(index)
    busy = [engine("a", prefill_queued=500), engine("b", prefill_queued=0)]
    assert kv.select(busy, features(kv, PROMPT)) is busy[1]
    light = [engine("a", prefill_queued=30), engine("b", prefill_queued=0)]
    assert kv.select(light, features(kv, PROMPT)) is light[0]


def test_scraped_waiting_requests_and_a_full_kv_cache_count_against_an_engine() -> None:
    index = FakeIndex()
    index.hold("a", PROMPT[:16])  # 84 + 3 x 84 = 336 on a, 100 + 3 x 100 = 400 on b
    kv = policy(index)
    waiting = [engine("a", waiting=2), engine("b")]
    assert kv.select(waiting, features(kv, PROMPT)) is waiting[1]
    full = [engine("a", kv_usage=0.99), engine("b", kv_usage=0.5)]
    assert kv.select(full, features(kv, PROMPT)) is full[1]
    roomy = [engine("a", kv_usage=0.85), engine("b", kv_usage=0.5)]
    assert kv.select(roomy, features(kv, PROMPT)) is roomy[0]


def test_requests_waiting_on_a_cached_engine_outweigh_its_cache() -> None:
    """Issue 17 finding 11: a cached engine that stopped answering drew every request, since
    nothing in its cost grew with what waited on it (its index holds the prompt)."""
    index = FakeIndex()
    index.hold("a", PROMPT)
    kv = policy(index)
    for awaiting, chosen in ((0, "a"), (1, "b")):
        engines = [engine("a", in_flight=awaiting, awaiting=awaiting), engine("b")]
        assert kv.select(engines, features(kv, PROMPT)) is engines[chosen == "b"]


def test_waiting_requests_count_once_whether_scraped_or_seen_by_the_router() -> None:
    index = FakeIndex()
    load = {"waiting": 2, "awaiting": 2, "in_flight": 2}
    assert kv_cost(index, **load) == kv_cost(index, waiting=2) == kv_cost(index, awaiting=2)
    assert kv_cost(index, waiting=1, awaiting=3) == kv_cost(index, awaiting=3)


def kv_cost(index: FakeIndex, **load: int) -> float:
    return ttft_cost(100, 0, engine("a", **load).load, policy(index).routing)


def test_an_adapters_blocks_are_not_the_base_models() -> None:
    index = FakeIndex()
    engines = [engine("a", adapters=["lora-x"]), engine("b", adapters=["lora-x"])]
    index.hold("a", PROMPT)  # the base model's blocks
    index.hold("b", PROMPT, lora="lora-x")
    kv = policy(index)
    assert kv.select(engines, features(kv, PROMPT, model="lora-x")) is engines[1]
    assert kv.select(engines, features(kv, PROMPT)) is engines[0]


def test_the_hit_stops_a_token_short_of_the_prompt_as_in_vllm() -> None:
    index = FakeIndex()
    index.hold("a", PROMPT)
    kv = policy(index)
    request = features(kv, PROMPT)
    kv.select([engine("a")], request)
    assert request.kv is not None and request.kv.predicted["a"] == len(PROMPT) - BS


def test_engines_with_other_block_sizes_are_matched_with_their_own_keys() -> None:
    index = FakeIndex()
    index.sizes["b"] = 16
    index.hold("b", PROMPT[:64])
    kv = policy(index)
    request = features(kv, PROMPT)
    assert kv.select([engine("a"), engine("b")], request) is not None
    assert request.kv is not None and request.kv.predicted == {"a": 0, "b": 64}


def test_ties_rotate_instead_of_always_taking_the_first_engine() -> None:
    kv = policy(FakeIndex())
    engines = [engine("a"), engine("b"), engine("c")]
    chosen = {kv.select(engines, features(kv, PROMPT)).id for _ in range(6)}  # type: ignore[union-attr]
    assert chosen == {"a", "b", "c"}
    unknown = {kv.select(engines, features(kv, None)).id for _ in range(6)}  # type: ignore[union-attr]
    assert unknown == {"a", "b", "c"}


def test_no_candidates_is_no_engine() -> None:
    kv = policy(FakeIndex())
    assert kv.select([], features(kv, PROMPT)) is None


def test_dispatch_queues_the_uncached_tokens_and_tells_the_index() -> None:
    index = FakeIndex()
    index.hold("a", PROMPT[:40])
    target = engine("a")
    request = KvRequest(index, MODEL, PROMPT)
    assert request.cached(target) == 40
    assert request.dispatch(target) == 60 and target.load.prefill_queued == 60
    request.prefilled(target)
    assert index.calls == [("routed", "a", 100, 40), ("prefilled", "a", 40)]
    assert request.receipt(target) == b"x-headcount-engine: a\r\nx-headcount-cached-tokens: 40\r\n"


def test_a_request_without_known_tokens_queues_nothing_and_tells_nothing() -> None:
    index = FakeIndex()
    target = engine("a")
    request = KvRequest(index, MODEL, None)
    assert request.dispatch(target) == 0 and target.load.prefill_queued == 0
    request.prefilled(target)
    assert index.calls == []


def test_make_policy_builds_kv_aware_only_with_its_index() -> None:
    routing = KvRouting(index=FakeIndex(), tokenizer=None)
    built = make_policy(RoutingName.KV_AWARE, affinity_epsilon=0.2, kv=routing)
    assert isinstance(built, KvAware) and built.name == "kv-aware"
    with pytest.raises(ValueError, match="kv-aware"):
        make_policy(RoutingName.KV_AWARE, affinity_epsilon=0.2)


# --- with a placement plan (`choose_placed`, `KvAware.select` with `--kv-placement on`)

ROUTING = KvRouting(index=FakeIndex(), tokenizer=None)


def test_a_request_goes_home_though_its_prefix_is_cached_elsewhere() -> None:
    engines = [engine("a"), engine("b", prefill_queued=60)]
    chosen, left = choose_placed(
        engines, [100, 0], 100, ROUTING, epsilon=0.5, start=0, homes={"b"}, penalty=100.0
    )
    assert (chosen, left) == (engines[1], False)


def test_a_request_leaves_its_homes_when_they_have_more_than_the_penalty_queued() -> None:
    engines = [engine("a", prefill_queued=10), engine("b", prefill_queued=111)]
    chosen, left = choose_placed(
        engines, [100, 0], 100, ROUTING, epsilon=0.5, start=0, homes={"b"}, penalty=100.0
    )
    assert (chosen, left) == (engines[0], True)


def test_a_request_leaves_its_homes_when_all_are_past_the_in_flight_bound() -> None:
    engines = [engine("a", in_flight=1), engine("b", in_flight=30), engine("c", in_flight=1)]
    chosen, left = choose_placed(
        engines, [0, 100, 0], 100, ROUTING, epsilon=0.5, start=0, homes={"b"}, penalty=1e9
    )
    assert chosen is not None and chosen.id in ("a", "c") and left


def test_the_best_of_several_homes_is_taken_and_homes_not_among_candidates_do_not_count() -> None:
    engines = [engine("a"), engine("b", prefill_queued=50), engine("c", prefill_queued=20)]
    chosen, left = choose_placed(
        engines, [0, 0, 0], 100, ROUTING, epsilon=0.5, start=0, homes={"b", "c"}, penalty=100.0
    )
    assert (chosen, left) == (engines[2], False)
    gone, left = choose_placed(
        engines, [0, 0, 0], 100, ROUTING, epsilon=0.5, start=0, homes={"z"}, penalty=100.0
    )
    assert (gone, left) == (engines[0], False)


def placed_policy(index: FakeIndex, clock: FakeClock) -> tuple[KvAware, Placement]:
    placement = Placement(PlacementSettings(), clock)
    routing = KvRouting(index=index, tokenizer=None, placement=placement)
    return KvAware(routing, epsilon=0.5), placement


def test_with_a_fresh_plan_the_tail_goes_to_the_spill_engine_and_overflow_is_counted() -> None:
    index, clock = FakeIndex(), FakeClock()
    kv, placement = placed_policy(index, clock)
    engines = [engine(name, kv_capacity_blocks=1000, kv_block_size=BS) for name in ("a", "b", "c")]
    index.hold("c", PROMPT)
    assert kv.select(engines, features(kv, PROMPT)) is engines[2]  # no plan yet: greedy
    placement.rebuild(engines, lambda _: True)
    plan = placement.current()
    assert plan is not None and plan.spill == ("a", "b") and not plan.homes  # all is tail
    chosen = kv.select(engines, features(kv, PROMPT))
    assert chosen is not None and chosen.id in ("a", "b")
    for spill in engines[:2]:
        spill.load.prefill_queued = 1000  # ten prompts more queued than the third
    assert kv.select(engines, features(kv, PROMPT)) is engines[2]
    assert placement.traffic.spill_overflow == 1
    (only,) = placement.traffic.groups()
    assert (only.key, only.rate) == (block_keys(PROMPT, BS, None)[3], 3.0)


def test_a_stale_plan_is_not_used() -> None:
    index, clock = FakeIndex(), FakeClock()
    kv, placement = placed_policy(index, clock)
    engines = [engine(name, kv_capacity_blocks=1000, kv_block_size=BS) for name in ("a", "b")]
    index.hold("b", PROMPT)
    placement.rebuild(engines, lambda _: True)
    assert kv.select(engines, features(kv, PROMPT)) is engines[0]  # the spill engine
    clock.advance(placement.settings.max_age + 1)
    assert kv.select(engines, features(kv, PROMPT)) is engines[1]
