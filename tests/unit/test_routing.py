"""Routing policies are pure decisions over a candidate list."""

from __future__ import annotations

from collections import Counter

from headcount.config import ProxySettings
from headcount.routing import (
    PREFIX_CHARS,
    Affinity,
    LeastLoaded,
    RequestFeatures,
    RoundRobin,
    RoutingName,
    make_policy,
    prompt_prefix_key,
    session_key,
)
from tests.support import engine

REQUEST = RequestFeatures(model="m")
EPSILON = ProxySettings().affinity_epsilon


def test_no_candidate_means_no_choice() -> None:
    assert RoundRobin().select((), REQUEST) is None
    assert LeastLoaded().select((), REQUEST) is None


def test_round_robin_spreads_evenly() -> None:
    engines = (engine("a"), engine("b"), engine("c"))
    policy = RoundRobin()
    picks = Counter(policy.select(engines, REQUEST).id for _ in range(300))  # type: ignore[union-attr]
    assert picks == {"a": 100, "b": 100, "c": 100}


def test_least_loaded_counts_in_flight_and_scraped_queue() -> None:
    busy_here = engine("a", in_flight=5)
    busy_there = engine("b", running=2, waiting=4)
    idle = engine("c", in_flight=1)
    policy = LeastLoaded()
    assert {policy.select((busy_here, busy_there, idle), REQUEST).id for _ in range(10)} == {"c"}  # type: ignore[union-attr]


def test_least_loaded_breaks_ties_round_robin() -> None:
    engines = (engine("a"), engine("b"))
    policy = LeastLoaded()
    picks = Counter(policy.select(engines, REQUEST).id for _ in range(10))  # type: ignore[union-attr]
    assert picks == {"a": 5, "b": 5}


def test_make_policy_by_name() -> None:
    assert isinstance(make_policy(RoutingName.ROUND_ROBIN, affinity_epsilon=EPSILON), RoundRobin)
    assert isinstance(make_policy(RoutingName.LEAST_LOADED, affinity_epsilon=EPSILON), LeastLoaded)


def no_headers(name: bytes) -> bytes | None:
    return None


def test_session_key_prefers_the_header_then_the_user_field() -> None:
    assert (
        session_key({"user": "u1"}, lambda name: b"s9" if name == b"x-session-id" else None) == "s9"
    )
    assert session_key({"user": "u1"}, no_headers) == "u1"
    assert session_key({"user": 3}, no_headers) is None


def test_prefix_key_reads_chat_text_in_order_and_is_bounded() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url"}]},
        ]
    }
    assert prompt_prefix_key(chat, no_headers) == "be brief\x1ehello"
    long = {"prompt": "x" * 5000}
    assert prompt_prefix_key(long, no_headers) == "x" * PREFIX_CHARS
    assert prompt_prefix_key({"prompt": ["first", "second"]}, no_headers) == "first"
    assert prompt_prefix_key({"messages": "not a list"}, no_headers) is None


def test_same_key_goes_to_the_same_engine() -> None:
    engines = tuple(engine(name) for name in "abcdef")
    policy = make_policy(RoutingName.SESSION, affinity_epsilon=EPSILON)
    picks = {policy.select(engines, RequestFeatures("m", "user-42")).id for _ in range(20)}  # type: ignore[union-attr]
    assert len(picks) == 1


def test_keys_spread_over_engines() -> None:
    engines = tuple(engine(name) for name in "abcd")
    policy = Affinity("session", session_key, epsilon=EPSILON)
    picks = Counter(policy.select(engines, RequestFeatures("m", f"k{i}")).id for i in range(400))  # type: ignore[union-attr]
    assert set(picks) == set("abcd")
    assert min(picks.values()) > 60


def test_an_engine_leaving_moves_only_its_own_keys() -> None:
    engines = tuple(engine(name) for name in "abcd")
    policy = Affinity("session", session_key, epsilon=EPSILON)
    keys = [f"k{i}" for i in range(200)]
    before = {k: policy.select(engines, RequestFeatures("m", k)).id for k in keys}  # type: ignore[union-attr]
    after = {k: policy.select(engines[:3], RequestFeatures("m", k)).id for k in keys}  # type: ignore[union-attr]
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "d" for k in moved)


def test_a_hot_key_spills_over_when_its_engine_is_above_the_load_bound() -> None:
    engines = [engine(name) for name in "ab"]
    policy = Affinity("session", session_key, epsilon=0.25)
    home = policy.select(engines, RequestFeatures("m", "hot"))
    assert home is not None
    home.load.in_flight = 10
    other = policy.select(engines, RequestFeatures("m", "hot"))
    assert other is not None and other.id != home.id


def test_requests_without_a_key_are_routed_least_loaded() -> None:
    engines = (engine("a", in_flight=3), engine("b"))
    policy = make_policy(RoutingName.PREFIX, affinity_epsilon=EPSILON)
    assert policy.select(engines, RequestFeatures("m")).id == "b"  # type: ignore[union-attr]
