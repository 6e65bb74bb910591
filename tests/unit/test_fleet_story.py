"""The fleet's story: one log line per engine state change, both ways, each with its reason.

The fleet is driven directly (a fake clock times ejections), then with the
reasons only discovery knows (a pod deleted, relabelled away, not ready,
terminating, a deletion the watch missed); discovery telling them through the
API server emulator is in test_discovery_k8s. A steady fleet logs nothing. The
JSON log mode carries each line's fields as top-level keys.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest

from headcount.config import OutlierSettings
from headcount.discovery.pods import deleted_reason, reconcile_listed
from headcount.discovery.source import SourceStatus
from headcount.fleet import EngineSpec, EngineState, ProbeResult
from headcount.fleet.outliers import HTTP_5XX
from headcount.logs import configure_logging
from headcount.sim.apiserver import make_pod
from tests.support import FakeClock, ready_fleet
from tests.support.story import lines

__all__: list[str] = []

CARDS = ({"id": "m"},)
OUTLIERS = OutlierSettings(
    consecutive_errors=2, base_ejection=30.0, max_ejection=100.0, max_ejected_percent=100.0
)
SPEC = EngineSpec(id="uid-a", name="ns/a", url="http://10.0.0.1:8000", source="k8s-pods")
OK = ProbeResult(ok=True, cards=CARDS)
DOWN = ProbeResult(ok=False, error="/v1/models: HTTP 404")


def test_an_engine_added_and_made_ready_is_told_with_its_source_and_models(
    story: pytest.LogCaptureFixture,
) -> None:
    ready_fleet(SPEC, outliers=OUTLIERS)
    assert lines(story) == [
        (logging.INFO, "engine ns/a added by k8s-pods at http://10.0.0.1:8000 (pending)"),
        (logging.INFO, "engine ns/a ready (was pending): probe passed; serves m"),
    ]


def test_an_engine_removed_is_told_with_the_reason_its_source_gives(
    story: pytest.LogCaptureFixture,
) -> None:
    fleet = ready_fleet(SPEC, outliers=OUTLIERS)
    lines(story)
    fleet.remove(SPEC.id, "pod deleted")
    assert lines(story) == [
        (logging.INFO, "engine ns/a removed from k8s-pods (was ready): pod deleted")
    ]
    fleet.remove(SPEC.id, "pod deleted")
    assert lines(story) == [], "an engine already gone is no news"


def test_failing_probes_take_an_engine_out_as_a_warning_and_a_passing_one_brings_it_back(
    story: pytest.LogCaptureFixture,
) -> None:
    fleet = ready_fleet(SPEC, outliers=OUTLIERS)
    lines(story)
    fleet.apply_probe(SPEC.id, DOWN)
    assert lines(story) == [], "one failure below --unhealthy-after changes no state"
    fleet.apply_probe(SPEC.id, DOWN)
    fleet.apply_probe(SPEC.id, DOWN)
    assert lines(story) == [
        (logging.WARNING, "engine ns/a unhealthy (was ready): probe failed: /v1/models: HTTP 404")
    ]
    fleet.apply_probe(SPEC.id, OK)
    assert lines(story) == [
        (logging.INFO, "engine ns/a ready (was unhealthy): probe passed; serves m")
    ]


def test_a_connect_failure_on_live_traffic_takes_an_engine_out_as_a_warning(
    story: pytest.LogCaptureFixture,
) -> None:
    fleet = ready_fleet(SPEC, outliers=OUTLIERS)
    lines(story)
    fleet.eject(SPEC.id, "connect failed: connection refused")
    fleet.eject(SPEC.id, "connect failed: connection refused")
    assert lines(story) == [
        (logging.WARNING, "engine ns/a unhealthy (was ready): connect failed: connection refused")
    ]


def test_an_outlier_ejection_is_told_with_its_reason_and_length_and_so_is_its_end(
    story: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    fleet = ready_fleet(SPEC, outliers=OUTLIERS, clock=clock)
    lines(story)
    fleet.record_error(SPEC.id, HTTP_5XX)
    fleet.record_error(SPEC.id, HTTP_5XX)
    assert fleet.snapshot.ejected == {SPEC.id}
    assert lines(story) == [
        (
            logging.WARNING,
            "engine ns/a ejected for 30s (ejection 1): 2 errors in a row, the last http_5xx",
        )
    ]
    clock.now += 30.0
    assert fleet.snapshot.ejected == frozenset()
    assert lines(story) == [(logging.INFO, "engine ns/a back in rotation: outlier ejection over")]


def test_sleeping_is_told_both_ways(story: pytest.LogCaptureFixture) -> None:
    fleet = ready_fleet(SPEC, outliers=OUTLIERS)
    lines(story)
    fleet.upsert(replace(SPEC, sleeping=True))
    assert lines(story) == [
        (logging.INFO, "engine ns/a sleeping (was ready): labelled sleeping=true")
    ]
    fleet.upsert(SPEC)
    assert lines(story) == [
        (logging.INFO, "engine ns/a ready (was sleeping): no longer labelled sleeping; serves m")
    ]


def test_not_ready_at_the_source_is_a_warning_and_ready_again_is_probed(
    story: pytest.LogCaptureFixture,
) -> None:
    fleet = ready_fleet(SPEC, outliers=OUTLIERS)
    lines(story)
    fleet.upsert(replace(SPEC, ready=False))
    assert lines(story) == [
        (logging.WARNING, "engine ns/a not_ready (was ready): not ready at k8s-pods")
    ]
    fleet.upsert(SPEC)
    assert lines(story) == [
        (logging.INFO, "engine ns/a pending (was not_ready): ready again at k8s-pods; probing it")
    ]


def test_an_engine_whose_address_moved_is_told_pending_until_probed(
    story: pytest.LogCaptureFixture,
) -> None:
    fleet = ready_fleet(SPEC, outliers=OUTLIERS)
    lines(story)
    fleet.upsert(replace(SPEC, url="http://10.0.0.9:8000"))
    assert lines(story) == [
        (
            logging.INFO,
            "engine ns/a pending (was ready): address changed to http://10.0.0.9:8000; probing it",
        )
    ]


def test_a_relist_that_removes_an_engine_says_the_watch_missed_its_deletion(
    story: pytest.LogCaptureFixture,
) -> None:
    fleet = ready_fleet(SPEC, outliers=OUTLIERS)
    status = SourceStatus(name="k8s-pods", kind="k8s-pods")
    lines(story)
    reconcile_listed(fleet, status, [])
    assert status.removed_by_relist == 1
    assert lines(story) == [
        (
            logging.WARNING,
            "engine ns/a removed from k8s-pods (was ready): "
            "relist removed: the watch missed its deletion",
        )
    ]


def test_a_steady_fleet_is_quiet(story: pytest.LogCaptureFixture) -> None:
    fleet = ready_fleet(SPEC, outliers=OUTLIERS)
    other = replace(SPEC, id="uid-b", name="ns/b", url="http://10.0.0.2:8000")
    fleet.upsert(other)
    fleet.apply_probe(other.id, DOWN)
    status = SourceStatus(name="k8s-pods", kind="k8s-pods")
    lines(story)
    for _ in range(3):
        reconcile_listed(fleet, status, [SPEC, other])
        fleet.upsert(SPEC)
        fleet.apply_probe(SPEC.id, OK)
        fleet.apply_probe(other.id, DOWN)
        fleet.snapshot  # noqa: B018 - a reader rebuilds the snapshot
    assert fleet.snapshot.by_id[other.id].state is EngineState.UNHEALTHY
    assert [r.getMessage() for r in story.records] == []


# --- why discovery removes an engine ---------------------------------------------------------


def test_a_deletion_event_says_deleted_only_when_the_object_was_being_deleted() -> None:
    pod = make_pod("a")
    deleted = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "t"}}
    assert deleted_reason(deleted, "pod") == "pod deleted"
    assert deleted_reason(pod, "pod") == "pod deleted or no longer selected"


# --- JSON logs -------------------------------------------------------------------------------


@pytest.fixture
def root_logging() -> Iterator[None]:
    """configure_logging replaces the root logger's handlers: put pytest's back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def logged(fmt: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What one fleet change and one failure with a traceback write to stderr in `fmt`."""
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    configure_logging(fmt, "INFO")
    fleet = ready_fleet(SPEC, outliers=OUTLIERS)
    fleet.remove(SPEC.id, "pod deleted")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("headcount.test").exception("failed", extra={"level": "forged"})
    return stderr.getvalue().splitlines()


@pytest.mark.usefixtures("root_logging")
def test_json_lines_carry_each_lines_fields_as_top_level_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    documents = [json.loads(line) for line in logged("json", monkeypatch) if line.startswith("{")]
    removed = next(d for d in documents if d.get("event") == "engine_removed")
    assert removed == {
        "time": removed["time"],
        "level": "info",
        "logger": "headcount.fleet",
        "message": "engine ns/a removed from k8s-pods (was ready): pod deleted",
        "event": "engine_removed",
        "engine": "ns/a",
        "source": "k8s-pods",
        "url": "http://10.0.0.1:8000",
        "state": "ready",
        "reason": "pod deleted",
    }
    ready = next(d for d in documents if d.get("event") == "engine_state")
    assert (ready["state"], ready["previous_state"]) == ("ready", "pending")
    failed = documents[-1]
    assert failed["level"] == "error", "a field never overrides the line's own keys"
    assert "RuntimeError: boom" in failed["exception"]


@pytest.mark.usefixtures("root_logging")
def test_text_lines_are_the_message_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    line = next(line for line in logged("text", monkeypatch) if "removed" in line)
    assert line.endswith(
        "INFO    headcount.fleet: engine ns/a removed from k8s-pods (was ready): pod deleted"
    )


@pytest.mark.usefixtures("root_logging")
def test_a_text_line_escapes_what_a_quoted_string_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine's model id with a line break and ANSI escapes stays inside its own line."""
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    configure_logging("text", "INFO")
    forged = "m\r\n2026-12-01 00:00:00 CRITICAL headcount: forged\x1b[31m\x9b2J\u2028tab\there"
    logging.getLogger("headcount.fleet").warning("model %s: over its engines", forged)
    (line,) = stderr.getvalue().splitlines()
    assert line.endswith(
        "model m\\r\\n2026-12-01 00:00:00 CRITICAL headcount: forged\\x1b[31m\\x9b2J\\u2028"
        "tab\there: over its engines"
    )
