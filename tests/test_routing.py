"""Routing policies are pure decisions over a candidate list."""

from __future__ import annotations

from collections import Counter

from headcount.fleet import Engine, EngineLoad, EngineSpec, EngineState
from headcount.routing import LeastLoaded, RequestFeatures, RoundRobin, RoutingName, make_policy

REQUEST = RequestFeatures(model="m")


def engine(name: str, *, in_flight: int = 0, running: float = 0, waiting: float = 0) -> Engine:
    return Engine(
        spec=EngineSpec(id=name, name=name, url=f"http://{name}", source="t"),
        load=EngineLoad(in_flight=in_flight),
        state=EngineState.READY,
        running=running,
        waiting=waiting,
    )


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
    assert isinstance(make_policy(RoutingName.ROUND_ROBIN), RoundRobin)
    assert isinstance(make_policy(RoutingName.LEAST_LOADED), LeastLoaded)
