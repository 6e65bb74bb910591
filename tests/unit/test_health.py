"""Health evaluation is a pure function of freshness, the fleet and the time."""

from __future__ import annotations

from headcount.config import HealthSettings, ProbeSettings
from headcount.discovery.source import SourceStatus
from headcount.fleet import Fleet, Snapshot
from headcount.routing.kv.planning import PlacementStatus
from headcount.surfaces.health import Status, evaluate, render_checks
from tests.support import ready_fleet, spec

SETTINGS = HealthSettings(discovery_stale_after=120, discovery_dead_after=300)
PROBE = ProbeSettings()


def routable_snapshot(count: int = 1) -> Snapshot:
    specs = [spec(f"e{i}", url="http://x", source="k") for i in range(count)]
    return ready_fleet(*specs).snapshot


def synced_source(at: float) -> SourceStatus:
    status = SourceStatus(name="pods", kind="k8s-pods", synced=True)
    status.last_list_success = at
    status.last_attempt_finished = at
    status.watch_connected = True
    return status


def judge(source: SourceStatus, now: float, snapshot: Snapshot | None = None, **kw: object):  # type: ignore[no-untyped-def]
    settings = kw.pop("settings", SETTINGS)
    return evaluate(
        [source],
        snapshot if snapshot is not None else routable_snapshot(),
        settings,  # type: ignore[arg-type]
        now=now,
        started=0.0,
        **kw,  # type: ignore[arg-type]
    )


def test_fresh_synced_router_with_engines_is_ok_live_and_ready() -> None:
    report = judge(synced_source(100.0), now=110.0)
    assert report.status is Status.OK and report.is_live and report.is_ready


def test_not_synced_is_not_ready_and_unavailable() -> None:
    report = judge(SourceStatus(name="pods", kind="k8s-pods"), now=1.0)
    assert not report.is_ready and report.status is Status.UNAVAILABLE
    assert report.is_live


def test_stale_discovery_is_degraded_but_still_ready_by_default() -> None:
    report = judge(synced_source(0.0), now=121.0)
    assert report.status is Status.DEGRADED
    assert report.is_ready
    assert "discovery stale: pods" in report.body["reasons"]


def test_stale_discovery_fails_readiness_when_required() -> None:
    settings = HealthSettings(discovery_stale_after=120, ready_requires_fresh=True)
    assert not judge(synced_source(0.0), now=121.0, settings=settings).is_ready
    assert judge(synced_source(0.0), now=119.0, settings=settings).is_ready


def test_watch_events_and_bookmarks_count_as_freshness() -> None:
    source = synced_source(0.0)
    source.last_event = 200.0
    assert judge(source, now=250.0).status is Status.OK


def test_unreachable_api_alone_never_fails_liveness() -> None:
    source = synced_source(0.0)
    source.last_attempt_finished = 990.0
    source.last_error = "connection refused"
    report = judge(source, now=1000.0)
    assert report.is_live and report.status is Status.DEGRADED


def test_wedged_loop_fails_liveness_after_the_bound() -> None:
    source = synced_source(0.0)
    assert judge(source, now=299.0).is_live
    report = judge(source, now=301.0)
    assert not report.is_live
    assert "no progress for 301s" in report.live[0].reason
    assert report.status is Status.UNAVAILABLE


def test_dead_loop_fails_liveness_at_once() -> None:
    report = judge(synced_source(0.0), now=1.0, dead_sources={"pods"})
    assert not report.is_live and "stopped" in report.live[0].reason


def test_no_routable_engine_is_unavailable_but_ready_unless_required() -> None:
    empty = Fleet(unhealthy_after=PROBE.unhealthy_after).snapshot
    assert judge(synced_source(0.0), now=1.0, snapshot=empty).is_ready
    report = judge(synced_source(0.0), now=1.0, snapshot=empty)
    assert report.status is Status.UNAVAILABLE
    settings = HealthSettings(ready_requires_engines=True)
    assert not judge(synced_source(0.0), now=1.0, snapshot=empty, settings=settings).is_ready


def test_shutting_down_is_not_ready() -> None:
    report = judge(synced_source(0.0), now=1.0, shutting_down=True)
    assert not report.is_ready and report.is_live


def test_static_source_never_goes_stale() -> None:
    static = SourceStatus(name="static", kind="static", can_go_stale=False, synced=True)
    static.last_list_success = 0.0
    report = judge(static, now=10_000.0)
    assert report.status is Status.OK and report.is_live


def test_health_body_reports_ages_relists_and_engines() -> None:
    source = synced_source(90.0)
    source.relists["watch-ended"] += 2
    source.removed_by_relist = 1
    body = judge(source, now=100.0, snapshot=routable_snapshot(2)).body
    described = body["sources"][0]
    assert described["last_list_age_seconds"] == 10.0
    assert described["relists"] == {"watch-ended": 2}
    assert described["removed_by_relist"] == 1
    assert body["engines"]["routable"] == 2 and body["engines"]["ready"] == 2


def test_rendered_checks_follow_the_kubernetes_format() -> None:
    report = judge(synced_source(0.0), now=1.0, shutting_down=True)
    status, text = render_checks("readyz", report.ready, verbose=False)
    assert status == 503
    assert "[+]synced ok" in text and "[-]shutdown failed: shutting down" in text
    assert render_checks("livez", report.live, verbose=False) == (200, "ok\n")
    status, text = render_checks("livez", report.live, verbose=True)
    assert text.endswith("livez check passed\n")


def test_an_unreachable_api_server_is_a_reason_at_once_while_the_status_stays() -> None:
    source = synced_source(100.0)
    source.last_error = "Cannot connect to host 127.0.0.1:6443"
    source.api_unreachable = True
    source.failing_since = 1_700_000_000.0  # 22:13:20 UTC
    report = judge(source, now=101.0)
    assert report.status is Status.OK
    assert report.body["reasons"] == [
        "API server unreachable since 22:13:20 UTC; routing on the last known fleet"
    ]


def test_an_api_server_that_answers_errors_is_a_reason_with_the_error() -> None:
    source = synced_source(100.0)
    source.last_error = "HTTP 403: forbidden"
    source.failing_since = 1_700_000_000.0
    (reason,) = judge(source, now=101.0).body["reasons"]
    assert reason.startswith("discovery failing (HTTP 403: forbidden) since 22:13:20 UTC")


def test_first_sync_not_done_says_what_the_attempts_found() -> None:
    source = SourceStatus(name="pods", kind="k8s-pods", last_error="Cannot connect")
    source.api_unreachable = True
    source.failing_since = 1.0
    report = judge(source, now=2.0, snapshot=Snapshot((), 0))
    assert "first sync not done: pods (API server unreachable)" in report.body["reasons"]
    assert report.no_engine == "first sync not done: API server unreachable"
    assert (
        "no routable engine: first sync not done: API server unreachable" in report.body["reasons"]
    )


def test_the_reason_no_engine_is_routable_is_empty_when_one_is() -> None:
    assert judge(synced_source(100.0), now=101.0).no_engine == ""


def test_what_a_source_is_missing_is_the_reason_no_engine_is_routable() -> None:
    source = synced_source(0.0)
    source.missing = "inference pool llama not found in namespace llm"
    empty = Fleet(unhealthy_after=PROBE.unhealthy_after).snapshot
    report = judge(source, now=1.0, snapshot=empty)
    assert report.no_engine == "inference pool llama not found in namespace llm"
    assert (
        "no routable engine: inference pool llama not found in namespace llm"
        in (report.body["reasons"])
    )
    assert report.body["sources"][0]["missing"] == source.missing


def test_the_placement_plan_is_shown_and_a_missing_one_does_not_degrade() -> None:
    used = PlacementStatus(True, "planned", 1.23, 3, ("e0",))
    report = judge(synced_source(100.0), now=110.0, kv_placement=used)
    assert report.status is Status.OK
    assert report.body["kv_placement"] == {
        "used": True,
        "reason": "planned",
        "age_s": 1.2,
        "homed_prefixes": 3,
        "spill": ["e0"],
    }
    missing = PlacementStatus(False, "kv index not usable on e0", None, 0, ())
    report = judge(synced_source(100.0), now=110.0, kv_placement=missing)
    assert report.status is Status.OK
    assert report.body["kv_placement"]["reason"] == "kv index not usable on e0"
    assert "kv_placement" not in judge(synced_source(100.0), now=110.0).body
