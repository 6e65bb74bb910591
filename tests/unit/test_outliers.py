"""Passive outlier detection: the pure decisions, then the fleet applying them on a fake clock.

No I/O: ejection lengths and the panic threshold are functions of counts, time
and settings; the fleet's ejections end when the test moves its clock, not
when a test waits. What the proxy feeds in (5xx answers, gateway errors) is
tested end to end in test_proxy.
"""

from __future__ import annotations

import json
import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headcount._http.local import LocalRequest
from headcount.config import HealthSettings, OutlierSettings
from headcount.fleet import EngineState, Fleet, FleetChange, ProbeResult
from headcount.fleet.outliers import GATEWAY_ERROR, HTTP_5XX, NOT_EJECTED, next_ejection, panicking
from headcount.fleet.vllm_load import VllmLoad
from headcount.surfaces.admin import AdminApp
from headcount.surfaces.metrics import Metrics
from tests.support import FakeClock, ready_fleet, spec

__all__: list[str] = []

OUTLIERS = OutlierSettings(
    consecutive_errors=3, base_ejection=30.0, max_ejection=100.0, max_ejected_percent=50.0
)
CARDS = ({"id": "m"},)


def fleet_of(*names: str, outliers: OutlierSettings | None = OUTLIERS) -> tuple[Fleet, FakeClock]:
    clock = FakeClock()
    specs = [spec(name, url="http://{name}:8000", source="s") for name in names]
    return ready_fleet(*specs, cards=CARDS, outliers=outliers, clock=clock), clock


def fail(fleet: Fleet, engine_id: str, times: int, reason: str = HTTP_5XX) -> list[bool]:
    return [fleet.record_error(engine_id, reason) for _ in range(times)]


def candidates(fleet: Fleet) -> list[str]:
    return [engine.id for engine in fleet.snapshot.candidates("m")]


# -- the decisions ----------------------------------------------------------------------------


def test_an_ejection_lasts_base_times_its_count_up_to_the_cap() -> None:
    ejection, now, seen = NOT_EJECTED, 0.0, []
    for _ in range(5):
        ejection = next_ejection(ejection, now, HTTP_5XX, OUTLIERS)
        seen.append((ejection.count, ejection.until - now))
        now = ejection.until  # ejected again the moment it returns
    assert seen == [(1, 30.0), (2, 60.0), (3, 90.0), (4, 100.0), (5, 100.0)]


def test_the_multiplier_decays_by_one_per_base_interval_spent_in_rotation() -> None:
    first = next_ejection(NOT_EJECTED, 0.0, GATEWAY_ERROR, OUTLIERS)
    second = next_ejection(first, first.until, GATEWAY_ERROR, OUTLIERS)
    assert (second.count, second.until) == (2, 90.0)
    # two base intervals in rotation take the multiplier from 2 to 0: it starts over
    later = next_ejection(second, second.until + 60, GATEWAY_ERROR, OUTLIERS)
    assert (later.count, later.until - (second.until + 60)) == (1, 30.0)
    soon = next_ejection(second, second.until + 29, GATEWAY_ERROR, OUTLIERS)
    assert soon.count == 3


@settings(max_examples=200)
@given(st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), max_size=30))
def test_every_ejection_lasts_between_base_and_cap(gaps: list[float]) -> None:
    ejection, now = NOT_EJECTED, 0.0
    for gap in gaps:
        now = max(now, ejection.until) + gap
        ejection = next_ejection(ejection, now, HTTP_5XX, OUTLIERS)
        length = ejection.until - now
        slack = 1e-9 * now  # float rounding of `now + length`
        assert OUTLIERS.base_ejection - slack <= length <= OUTLIERS.max_ejection + slack
        assert ejection.count >= 1 and ejection.active(now) and not ejection.active(ejection.until)


@pytest.mark.parametrize(
    ("ejected", "total", "percent", "panic"),
    [
        (0, 1, 0.0, False),
        (1, 2, 50.0, False),
        (2, 2, 50.0, True),
        (1, 1, 50.0, True),
        (2, 3, 50.0, True),
        (1, 3, 50.0, False),
        (3, 3, 100.0, False),
        (1, 10, 10.0, False),
        (2, 10, 10.0, True),
    ],
)
def test_panic_only_past_the_share(ejected: int, total: int, percent: float, panic: bool) -> None:
    assert panicking(ejected, total, percent) is panic


# -- the fleet applying them ------------------------------------------------------------------


def test_consecutive_errors_eject_an_engine_until_its_interval_ends() -> None:
    fleet, clock = fleet_of("a", "b")
    assert fail(fleet, "a", 3) == [False, False, True]
    assert candidates(fleet) == ["b"]
    engine = fleet.snapshot.by_id["a"]
    assert engine.state is EngineState.READY, "ejection is not a probe verdict"
    assert engine.ejection.reason == HTTP_5XX and engine.load.consecutive_errors == 0
    clock.now += 29.9
    assert candidates(fleet) == ["b"]
    clock.now += 0.1
    assert candidates(fleet) == ["a", "b"], "back when the interval ends, with no write"


def test_errors_below_the_threshold_or_with_detection_off_never_eject() -> None:
    fleet, _ = fleet_of("a", "b")
    assert fail(fleet, "a", 2) == [False, False]
    fleet.snapshot.by_id["a"].load.consecutive_errors = 0  # what the proxy does on a 200
    assert fail(fleet, "a", 2) == [False, False]
    assert candidates(fleet) == ["a", "b"]
    for off in (None, OutlierSettings(consecutive_errors=0)):
        quiet, _ = fleet_of("a", "b", outliers=off)
        assert not any(fail(quiet, "a", 20))
        assert candidates(quiet) == ["a", "b"]


def test_repeated_ejections_grow_and_errors_while_ejected_do_not_extend_it() -> None:
    fleet, clock = fleet_of("a", "b")
    fail(fleet, "a", 3)
    first = fleet.snapshot.by_id["a"].ejection
    assert fail(fleet, "a", 3) == [False, False, False], "answers to requests sent before"
    assert fleet.snapshot.by_id["a"].ejection == first
    clock.now = first.until
    assert fail(fleet, "a", 3)[-1]
    second = fleet.snapshot.by_id["a"].ejection
    assert (second.count, second.until - clock.now) == (2, 60.0)


def test_a_probe_after_a_failed_probe_ends_the_ejection_and_a_passing_one_does_not() -> None:
    fleet, _ = fleet_of("a", "b")
    fail(fleet, "a", 3)
    fleet.apply_probe("a", ProbeResult(ok=True, cards=CARDS))
    assert candidates(fleet) == ["b"], "probes kept passing while requests failed"
    fleet.apply_probe("a", ProbeResult(ok=False, error="refused"))
    fleet.apply_probe("a", ProbeResult(ok=True, cards=CARDS))
    assert candidates(fleet) == ["a", "b"], "the engine went down and came back"
    assert fleet.snapshot.by_id["a"].ejection.count == 1, "its history is kept"


def test_past_the_panic_threshold_a_model_is_routed_to_all_its_engines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet, clock = fleet_of("a", "b")
    caplog.set_level(logging.INFO, logger="headcount.fleet")
    fail(fleet, "a", 3)
    assert candidates(fleet) == ["b"]
    fail(fleet, "b", 3)
    assert candidates(fleet) == ["a", "b"], "2 of 2 ejected is over 50%: route to all"
    assert fleet.snapshot.panicking == {"m"} and fleet.snapshot.ejected == {"a", "b"}
    fail(fleet, "a", 2)
    fleet.apply_probe("b", ProbeResult(ok=True, cards=CARDS, load=VllmLoad(running=3)))
    assert candidates(fleet) == ["a", "b"]
    clock.now += 30
    assert candidates(fleet) == ["a", "b"] and fleet.snapshot.panicking == frozenset()
    messages = [record.getMessage() for record in caplog.records]
    assert sum("routing to all of them" in message for message in messages) == 1, messages
    assert sum("no longer panicking" in message for message in messages) == 1, messages
    assert sum("ejected for 30s" in message for message in messages) == 2, messages


def test_an_ejected_engine_is_heard_leaving_rotation_and_asks_for_no_probe() -> None:
    heard: list[FleetChange] = []
    fleet, _ = fleet_of("a", "b")
    fleet.subscribe(heard.append)
    fail(fleet, "a", 3)
    fail(fleet, "a", 3)  # already out: nothing more to say
    assert [(change.left, change.to_probe) for change in heard] == [(("a",), ())]


# -- what people and Prometheus see ----------------------------------------------------------


async def test_engines_and_metrics_show_ejections() -> None:
    fleet, clock = fleet_of("a", "b")
    metrics = Metrics(lambda: fleet.snapshot)
    admin = AdminApp(
        fleet,
        metrics,
        [],
        HealthSettings(),
        dead_sources=set,
        shutting_down=lambda: False,
    )
    fail(fleet, "a", 3, GATEWAY_ERROR)
    fail(fleet, "b", 1)
    clock.now += 10
    response = await admin.handle(LocalRequest("GET", "/engines", "", {}, b""))
    outliers = {engine["id"]: engine["outlier"] for engine in json.loads(response.body)["engines"]}
    assert outliers == {
        "a": {
            "ejected": True,
            "ejected_for_seconds": 20.0,
            "ejections": 1,
            "last_ejection_reason": GATEWAY_ERROR,
            "consecutive_errors": 0,
        },
        "b": {
            "ejected": False,
            "ejected_for_seconds": None,
            "ejections": 0,
            "last_ejection_reason": None,
            "consecutive_errors": 1,
        },
    }
    text = (await metrics.render()).decode()
    assert "headcount_outlier_ejected_engines 1.0" in text
    clock.now += 20
    assert "headcount_outlier_ejected_engines 0.0" in (await metrics.render()).decode()


# -- an invariant over any history ------------------------------------------------------------

STEPS = st.lists(
    st.tuples(
        st.sampled_from(["error", "success", "probe_ok", "probe_fail", "eject", "wait"]),
        st.sampled_from(["a", "b", "c"]),
        st.floats(min_value=0, max_value=120, allow_nan=False),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(STEPS, st.sampled_from([0.0, 34.0, 50.0, 67.0, 99.0]))
def test_a_model_with_a_ready_engine_always_has_a_candidate(
    steps: list[tuple[str, str, float]], percent: float
) -> None:
    """Whatever errors, probes and time do, outlier ejection alone never leaves a model
    without an engine (the panic threshold), and an ejected engine is routed to only while
    its model panics."""
    outliers = OutlierSettings(consecutive_errors=2, max_ejected_percent=percent)
    fleet, clock = fleet_of("a", "b", "c", outliers=outliers)
    for action, engine_id, seconds in steps:
        if action == "error":
            fleet.record_error(engine_id, HTTP_5XX)
        elif action == "success":
            fleet.snapshot.by_id[engine_id].load.consecutive_errors = 0
        elif action == "probe_ok":
            fleet.apply_probe(engine_id, ProbeResult(ok=True, cards=CARDS))
        elif action == "probe_fail":
            fleet.apply_probe(engine_id, ProbeResult(ok=False, error="x"))
        elif action == "eject":
            fleet.eject(engine_id, "connect refused")
        else:
            clock.now += seconds
        snapshot = fleet.snapshot
        ready = [engine.id for engine in snapshot.engines if engine.routable]
        chosen = [engine.id for engine in snapshot.candidates("m")]
        assert bool(chosen) == bool(ready), (ready, chosen, snapshot.ejected)
        for engine_id in chosen:
            assert engine_id not in snapshot.ejected or "m" in snapshot.panicking
        assert snapshot.ejected == {
            engine.id for engine in snapshot.engines if engine.ejection.active(clock.now)
        }
        assert all(
            math.isfinite(e.ejection.until) or e.ejection.count == 0 for e in snapshot.engines
        )
