"""`HealthWatch` logs each change of `/health`'s status and leaves the 503's reason on the fleet."""

from __future__ import annotations

import logging

import pytest

from headcount.config import HealthSettings
from headcount.discovery.source import SourceStatus, Watched
from headcount.fleet import Fleet
from headcount.surfaces.health import evaluate
from headcount.surfaces.health_watch import HealthWatch
from tests.support import ready_fleet, spec


def _watch(source: SourceStatus, fleet: Fleet) -> HealthWatch:
    settings = HealthSettings(discovery_stale_after=120)
    return HealthWatch(
        lambda: evaluate([source], fleet.snapshot, settings, now=10.0, started=0.0), fleet
    )


def test_each_status_change_is_logged_once_with_its_reasons(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = SourceStatus(name="pods", kind="k8s-pods")
    fleet = ready_fleet(spec("e0", url="http://x", source="pods"))
    watch = _watch(source, fleet)
    with caplog.at_level(logging.INFO, logger="headcount.health"):
        watch.check()
        watch.check()
        source.synced, source.last_list_success, source.last_attempt_finished = True, 9.0, 9.0
        watch.check()
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "/health unavailable: first sync not done: pods; discovery stale: pods",
        "/health ok (was unavailable)",
    ]
    assert [record.levelno for record in caplog.records] == [logging.INFO, logging.INFO]
    assert caplog.records[1].reasons == []  # type: ignore[attr-defined]
    source.synced = False
    with caplog.at_level(logging.INFO, logger="headcount.health"):
        watch.check()
    assert caplog.records[-1].levelno == logging.WARNING
    assert caplog.records[-1].getMessage().startswith("/health unavailable (was ok): ")


def test_the_reason_no_engine_is_routable_is_left_on_the_fleet() -> None:
    watched = Watched("pods", namespace="default", label_selector="app=vlm")
    source = SourceStatus(name="pods", kind="k8s-pods", synced=True, watches=watched)
    source.last_list_success = source.last_attempt_finished = 9.0
    fleet = Fleet(unhealthy_after=1)
    _watch(source, fleet).check()
    assert fleet.unroutable_reason == "no pods match selector app=vlm in namespace default"
