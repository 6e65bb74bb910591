"""The reflector's list+watch discipline, driven by a scripted ListerWatcher and a fake clock.

Every script ends by blocking in LIST; the test then cancels the loop and
reads what happened: the calls made, the back-off slept, the status kept.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from headcount.config import DiscoverySettings, ProbeSettings
from headcount.discovery.build import reflector_timing
from headcount.discovery.errors import ApiStatusError, ApiUnreachable, WatchExpired, WatchIdle
from headcount.discovery.listwatch import KubeObject, WatchEvent
from headcount.discovery.pods import PodSource
from headcount.discovery.reflector import Reflector
from headcount.discovery.services import ServiceSource
from headcount.discovery.source import SourceStatus
from headcount.fleet import Fleet
from tests.support import FakeClock

SETTINGS = DiscoverySettings()
"""The defaults: watch timeouts in 300-600 s, back-off from 0.8 s to 30 s."""
TIMING = reflector_timing(SETTINGS)


@dataclass(frozen=True)
class Advance:
    """A watch script step: the fake clock moves on (the stream was open that long)."""

    seconds: float


Step = WatchEvent | Exception | Advance
Listing = tuple[list[KubeObject], str] | Exception


class NoJitter(random.Random):
    """`random()` is 0: back-off is exactly initial * 2**n, watch timeouts are the minimum."""

    def random(self) -> float:
        return 0.0


class MostJitter(random.Random):
    """`random()` just under 1: every back-off nearly twice its base, the most jitter gives."""

    def random(self) -> float:
        return 0.999


class FakeListerWatcher:
    """Answers LISTs and WATCHes from scripts; blocks in LIST once the scripts run out."""

    def __init__(
        self, clock: FakeClock, lists: Sequence[Listing], watches: Sequence[Sequence[Step]]
    ) -> None:
        self.clock = clock
        self.lists: deque[Listing] = deque(lists)
        self.watches: deque[Sequence[Step]] = deque(watches)
        self.calls: list[tuple[Any, ...]] = []
        self.exhausted = asyncio.Event()

    async def list(self, label_selector: str) -> tuple[list[KubeObject], str]:
        self.calls.append(("list", label_selector))
        if not self.lists:
            self.exhausted.set()
            await asyncio.Event().wait()
        answer = self.lists.popleft()
        if isinstance(answer, Exception):
            raise answer
        return answer

    @asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_seconds: int, label_selector: str
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        self.calls.append(("watch", resource_version, timeout_seconds))
        yield self._events(self.watches.popleft() if self.watches else [])

    async def _events(self, script: Sequence[Step]) -> AsyncIterator[WatchEvent]:
        for step in script:
            if isinstance(step, Advance):
                self.clock.now += step.seconds
            elif isinstance(step, Exception):
                raise step
            else:
                yield step

    async def reachable(self) -> bool:
        """Never answers: back-off tests see the whole back-off."""
        await asyncio.Event().wait()
        return True

    def kinds(self) -> list[str]:
        return [call[0] for call in self.calls]


def pod(name: str, version: str = "1", ip: str = "10.0.0.1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": version,
            "labels": {"model": "m"},
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def event(kind: str, obj: KubeObject) -> WatchEvent:
    return WatchEvent(kind, obj)


def bookmark(version: str) -> WatchEvent:
    return WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": version}})


class Recorder:
    """A reflector's consumer that remembers what it was told."""

    def __init__(self) -> None:
        self.lists: list[list[KubeObject]] = []
        self.events: list[tuple[str, str]] = []

    def on_list(self, items: list[KubeObject]) -> None:
        self.lists.append(items)

    def on_event(self, kind: str, obj: KubeObject) -> None:
        self.events.append((kind, obj["metadata"]["name"]))


def reflector_for(
    fake: FakeListerWatcher, recorder: Recorder | None = None, **overrides: Any
) -> Reflector:
    """A reflector on the fake's clock, without jitter unless `overrides` say otherwise."""
    recorder = recorder or Recorder()
    options: dict[str, Any] = {
        "status": SourceStatus(name="test", kind="k8s-pods"),
        "on_list": recorder.on_list,
        "on_event": recorder.on_event,
        "label_selector": "app=vllm",
        "timing": TIMING,
        "clock": fake.clock,
        "wall_clock": lambda: 1.7e9 + fake.clock.now,
        "sleep": fake.clock.sleep,
        "rng": NoJitter(),
    }
    return Reflector(fake, **(options | overrides))


def new_fleet() -> Fleet:
    return Fleet(unhealthy_after=ProbeSettings().unhealthy_after)


def pod_source(fleet: Fleet, fake: FakeListerWatcher) -> PodSource:
    """A pod source over the fake, on its clock, with the default settings."""
    return PodSource(
        fleet,
        fake,
        engine_port=SETTINGS.engine_port,
        namespace="default",
        label_selector=SETTINGS.label_selector,
        timing=TIMING,
        clock=fake.clock,
        sleep=fake.clock.sleep,
    )


async def run_until_exhausted(fake: FakeListerWatcher, *loops: Any) -> None:
    """Run the loops until the fake's scripts are used up, then cancel them."""
    tasks = [asyncio.ensure_future(loop.run()) for loop in loops]
    try:
        await asyncio.wait_for(fake.exhausted.wait(), timeout=5)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        assert task.cancelled(), "the loop ended on its own"


async def test_every_watch_end_leads_to_a_relist_never_a_rewatch() -> None:
    clock = FakeClock()
    fake = FakeListerWatcher(
        clock,
        lists=[([pod("a")], "10"), ([pod("a")], "20")],
        watches=[[Advance(300)], [event("ADDED", pod("b", "21")), Advance(5)]],
    )
    reflector = reflector_for(fake)
    await run_until_exhausted(fake, reflector)
    assert fake.kinds() == ["list", "watch", "list", "watch", "list"]
    assert [call[1] for call in fake.calls if call[0] == "watch"] == ["10", "20"]
    assert reflector.status.relists == {"start": 1, "watch-ended": 2}
    assert clock.slept == [], "a healthy watch end relists at once"


async def test_an_expired_watch_relists_at_once() -> None:
    clock = FakeClock()
    fake = FakeListerWatcher(
        clock,
        lists=[([], "10")],
        watches=[[event("ADDED", pod("a", "11")), WatchExpired("410 Gone: too old")]],
    )
    reflector = reflector_for(fake)
    await run_until_exhausted(fake, reflector)
    assert reflector.status.relists == {"start": 1, "expired": 1}
    assert clock.slept == []


async def test_an_expired_watch_that_never_started_backs_off_before_relisting() -> None:
    """410 at once (an HTTP 410, or an ERROR event as first line): no hot loop."""
    clock = FakeClock()
    fake = FakeListerWatcher(clock, lists=[([], "10")], watches=[[WatchExpired("410 Gone")]])
    reflector = reflector_for(fake)
    await run_until_exhausted(fake, reflector)
    assert reflector.status.relists == {"start": 1, "error": 1}
    assert clock.slept == [0.8]
    assert "410 Gone" in (reflector.status.last_error or "")


async def test_an_idle_watch_relists() -> None:
    clock = FakeClock()
    fake = FakeListerWatcher(
        clock,
        lists=[([], "10"), ([pod("added-while-stalled")], "99")],
        watches=[[bookmark("12"), Advance(90), WatchIdle("no byte for 90s")], [Advance(2)]],
    )
    recorder = Recorder()
    reflector = reflector_for(fake, recorder)
    await run_until_exhausted(fake, reflector)
    assert reflector.status.relists == {"start": 1, "idle-timeout": 1, "watch-ended": 1}
    assert recorder.lists[-1][0]["metadata"]["name"] == "added-while-stalled"
    assert clock.slept == []


async def test_very_short_empty_watches_back_off_exponentially_up_to_the_cap() -> None:
    clock = FakeClock()
    rounds = 7
    fake = FakeListerWatcher(
        clock, lists=[([], str(n)) for n in range(rounds)], watches=[[]] * rounds
    )
    timing = reflector_timing(DiscoverySettings(backoff_max=10))
    reflector = reflector_for(fake, timing=timing)
    await run_until_exhausted(fake, reflector)
    assert clock.slept == [0.8, 1.6, 3.2, 6.4, 10, 10, 10]
    assert reflector.status.relists["error"] == rounds
    assert "without an event" in (reflector.status.last_error or "")


async def test_a_short_watch_with_events_is_healthy() -> None:
    clock = FakeClock()
    fake = FakeListerWatcher(clock, lists=[([], "1")], watches=[[event("ADDED", pod("a", "2"))]])
    reflector = reflector_for(fake)
    await run_until_exhausted(fake, reflector)
    assert clock.slept == []
    assert reflector.status.relists == {"start": 1, "watch-ended": 1}


async def test_jitter_spreads_the_back_off_between_one_and_two_times() -> None:
    clock = FakeClock()
    fake = FakeListerWatcher(
        clock, lists=[ApiUnreachable("refused")] * 20 + [([], "1")], watches=[]
    )
    reflector = reflector_for(
        fake,
        timing=reflector_timing(DiscoverySettings(backoff_initial=1, backoff_max=1000)),
        rng=random.Random(7),
    )
    await run_until_exhausted(fake, reflector)
    for n, delay in enumerate(clock.slept[:8]):
        assert 2**n <= delay < 2 ** (n + 1)
    assert len(set(clock.slept)) == len(clock.slept)


async def test_the_cap_holds_with_the_most_jitter() -> None:
    """`--backoff-max` bounds every wait, jitter included (the `--discovery-dead-after` check
    relies on it): the cap is applied after the jitter, not to the base before it."""
    clock = FakeClock()
    fake = FakeListerWatcher(clock, lists=[ApiUnreachable("refused")] * 8 + [([], "1")], watches=[])
    reflector = reflector_for(
        fake,
        timing=reflector_timing(DiscoverySettings(backoff_initial=1, backoff_max=10)),
        rng=MostJitter(),
    )
    await run_until_exhausted(fake, reflector)
    assert clock.slept[:3] == pytest.approx([1.999, 3.998, 7.996])
    assert clock.slept[3:] == [10] * (len(clock.slept) - 3) and len(clock.slept) >= 6


class LongBackOffClock(FakeClock):
    """A back-off of `LONG` seconds or more never ends on its own; shorter sleeps pass at once."""

    LONG = 20.0

    async def sleep(self, seconds: float) -> None:
        if seconds < self.LONG:
            await super().sleep(seconds)
            return
        self.slept.append(seconds)
        await asyncio.Event().wait()


class AnswersWhenAsked(FakeListerWatcher):
    """`reachable()` gives the scripted answers in turn, then never answers again."""

    def __init__(self, *args: Any, answers: Sequence[bool]) -> None:
        super().__init__(*args)
        self.answers = deque(answers)

    async def reachable(self) -> bool:
        if not self.answers:
            return await super().reachable()
        return self.answers.popleft()


@pytest.mark.parametrize(
    ("lists", "watches", "answers"),
    [
        pytest.param(
            [ApiUnreachable("LIST pods: connection refused"), ([], "1")],
            [[Advance(2)]],
            [False, False, True],
            id="a refused LIST: back as soon as it answers",
        ),
        pytest.param(
            [([], "1"), ([], "2")],
            [[Advance(2), ApiUnreachable("WATCH pods: stream broken")], [Advance(2)]],
            [True, False, True],
            id="a broken watch: back once it was seen down and answers",
        ),
    ],
)
async def test_the_api_answering_again_cuts_the_back_off_short_on_the_injected_clock(
    lists: list[Listing], watches: list[list[Step]], answers: list[bool]
) -> None:
    clock = LongBackOffClock()
    fake = AnswersWhenAsked(clock, lists, watches, answers=answers)
    timing = reflector_timing(DiscoverySettings(backoff_initial=clock.LONG))
    reflector = reflector_for(fake, timing=timing)
    await run_until_exhausted(fake, reflector)
    assert clock.slept == [clock.LONG, 0.2, 0.2], "the back-off, then two reachability polls"
    assert not fake.answers, "every scripted answer was asked for"
    assert reflector.status.relists["error"] == 1 and reflector.status.last_error is None
    assert reflector.status.last_list_success == pytest.approx(clock.now - 2), "relisted at once"


async def test_back_off_starts_over_after_a_healthy_period() -> None:
    clock = FakeClock()
    refused = ApiUnreachable("LIST pods: connection refused")
    fake = FakeListerWatcher(
        clock,
        lists=[refused, refused, refused, ([], "1"), refused, ([], "2"), refused],
        watches=[[bookmark("2"), Advance(130)], [bookmark("3"), Advance(10)]],
    )
    reflector = reflector_for(fake)
    await run_until_exhausted(fake, reflector)
    # three failures grow; after 130 s healthy the next starts at 0.8 again;
    # after only 10 s healthy it keeps growing
    assert clock.slept == [0.8, 1.6, 3.2, 0.8, 1.6]


async def test_watch_timeouts_are_drawn_between_min_and_max() -> None:
    clock = FakeClock()
    fake = FakeListerWatcher(
        clock, lists=[([], str(n)) for n in range(29)], watches=[[Advance(2)]] * 29
    )
    reflector = reflector_for(fake, rng=random.Random(1))
    await run_until_exhausted(fake, reflector)
    timeouts = [call[2] for call in fake.calls if call[0] == "watch"]
    assert all(300 <= t <= 600 for t in timeouts)
    assert len(set(timeouts)) > 10, "replicas must not relist in lockstep"


async def test_bookmarks_advance_the_resource_version_and_freshness() -> None:
    clock = FakeClock()
    seen: list[tuple[str | None, float | None]] = []
    fake = FakeListerWatcher(
        clock,
        lists=[([], "10")],
        watches=[[Advance(30), bookmark("25"), Advance(30), bookmark("31"), Advance(1)]],
    )
    recorder = Recorder()
    status = SourceStatus(name="test", kind="k8s-pods")

    def on_status() -> None:
        seen.append((status.resource_version, status.last_event))

    reflector = reflector_for(fake, recorder, status=status, on_status=on_status)
    await run_until_exhausted(fake, reflector)
    assert ("25", 1030.0) in seen and ("31", 1060.0) in seen
    assert recorder.events == [], "bookmarks are not changes"
    assert reflector.status.resource_version == "31"


async def test_status_tracks_sync_attempts_connection_and_errors() -> None:
    clock = FakeClock()
    connected_during_events: list[bool] = []
    fake = FakeListerWatcher(
        clock,
        lists=[ApiStatusError(403, "LIST pods: HTTP 403: forbidden"), ([pod("a")], "10")],
        watches=[[Advance(5), event("MODIFIED", pod("a", "11")), Advance(5)]],
    )
    status = SourceStatus(name="test", kind="k8s-pods")
    snapshots: list[SourceStatus] = []

    def on_event(kind: str, obj: KubeObject) -> None:
        connected_during_events.append(status.watch_connected)

    def on_status() -> None:
        snapshots.append(
            SourceStatus(
                name="copy",
                kind="k8s-pods",
                synced=status.synced,
                last_error=status.last_error,
                last_list_success=status.last_list_success,
            )
        )

    reflector = reflector_for(
        fake, status=status, on_event=on_event, on_status=on_status, wall_clock=lambda: 1.7e9
    )
    assert not status.synced
    await run_until_exhausted(fake, reflector)
    assert any(s.last_error == "LIST pods: HTTP 403: forbidden" and not s.synced for s in snapshots)
    assert connected_during_events == [True]
    assert status.synced and status.last_error is None and not status.watch_connected
    assert status.last_list_success == 1000.8  # after one 0.8 s back-off
    assert status.last_event == 1005.8
    assert status.resource_version == "11"
    assert status.last_attempt_started == 1010.8 and status.last_attempt_finished == 1010.8
    assert status.wall_last_sync == 1.7e9
    assert status.last_success == 1005.8


async def test_a_malformed_object_is_isolated_and_logged_once_per_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    bad = pod("bad", "11")
    fake = FakeListerWatcher(
        clock,
        lists=[([], "10")],
        watches=[
            [
                event("ADDED", bad),
                event("MODIFIED", bad),
                event("ADDED", pod("good", "12")),
                event("MODIFIED", pod("bad", "13")),
            ]
        ],
    )
    recorder = Recorder()

    def on_event(kind: str, obj: KubeObject) -> None:
        if obj["metadata"]["name"] == "bad":
            raise KeyError("spec")
        recorder.on_event(kind, obj)

    reflector = reflector_for(fake, recorder, on_event=on_event)
    with caplog.at_level(logging.WARNING, logger="headcount.discovery.isolation"):
        await run_until_exhausted(fake, reflector)
    assert recorder.events == [("ADDED", "good")]
    skipped = [r.getMessage() for r in caplog.records if "skipping default/bad" in r.getMessage()]
    assert len(skipped) == 2, "once per resourceVersion: 11 and 13"
    assert "resourceVersion 11" in skipped[0] and "resourceVersion 13" in skipped[1]
    assert reflector.status.relists == {"start": 1, "watch-ended": 1}


async def test_unknown_event_types_are_skipped_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    odd = WatchEvent("SURPRISE", {"metadata": {"resourceVersion": "12"}})
    fake = FakeListerWatcher(
        clock,
        lists=[([], "10")],
        watches=[[odd, odd, event("ADDED", pod("a", "13"))]],
    )
    recorder = Recorder()
    reflector = reflector_for(fake, recorder)
    with caplog.at_level(logging.WARNING, logger="headcount.discovery.reflector"):
        await run_until_exhausted(fake, reflector)
    assert recorder.events == [("ADDED", "a")]
    assert sum("SURPRISE" in r.getMessage() for r in caplog.records) == 1


async def test_an_unexpected_exception_never_ends_the_loop() -> None:
    clock = FakeClock()
    fake = FakeListerWatcher(clock, lists=[([], "1"), ([], "2")], watches=[[Advance(2)]])
    calls = 0

    def on_list(items: list[KubeObject]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in a consumer")

    reflector = reflector_for(fake, on_list=on_list)
    await run_until_exhausted(fake, reflector)
    assert calls == 2 and clock.slept == [0.8]
    assert reflector.status.synced and reflector.status.last_error is None


async def test_repeated_identical_errors_warn_once_and_recovery_is_always_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    refused = ApiUnreachable("LIST pods: connection refused")
    fake = FakeListerWatcher(clock, lists=[refused] * 5 + [([], "1")], watches=[[Advance(2)]])
    reflector = reflector_for(fake)
    with caplog.at_level(logging.DEBUG, logger="headcount.discovery.reflector"):
        await run_until_exhausted(fake, reflector)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    recovered = [r for r in caplog.records if "recovered" in r.getMessage()]
    assert len(warnings) == 1 and "connection refused" in warnings[0].getMessage()
    assert len(recovered) == 1 and recovered[0].levelno == logging.INFO
    assert "5 failed attempts" in recovered[0].getMessage()


async def test_a_loop_that_keeps_failing_reminds_at_least_every_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    refused = ApiUnreachable("LIST pods: connection refused")
    fake = FakeListerWatcher(clock, lists=[refused] * 12, watches=[])
    reflector = reflector_for(fake)  # 0.8 .. 30 s back-off: ~250 s in all
    with caplog.at_level(logging.WARNING, logger="headcount.discovery.reflector"):
        await run_until_exhausted(fake, reflector)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert sum(clock.slept) > 200
    assert 3 <= len(warnings) <= 6


async def test_a_missed_deletion_is_removed_by_the_relist_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    fleet = new_fleet()
    fake = FakeListerWatcher(
        clock,
        lists=[([pod("a"), pod("b", ip="10.0.0.2")], "10"), ([pod("a")], "30")],
        watches=[[Advance(2), ApiUnreachable("WATCH pods: stream broken")]],
    )
    source = pod_source(fleet, fake)
    with caplog.at_level(logging.WARNING, logger="headcount.discovery.pods"):
        await run_until_exhausted(fake, source)
    assert fleet.source_ids("k8s-pods") == {"uid-a"}
    assert source.status.removed_by_relist == 1
    assert any("default/b" in r.getMessage() for r in caplog.records)


async def test_pod_events_upsert_and_remove_engines() -> None:
    clock = FakeClock()
    fleet = new_fleet()
    not_ready = pod("a", "12")
    not_ready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    fake = FakeListerWatcher(
        clock,
        lists=[([], "10")],
        watches=[
            [
                event("ADDED", pod("a", "11")),
                event("ADDED", pod("b", "11")),
                event("MODIFIED", not_ready),
                event("DELETED", pod("b", "13")),
                event("ADDED", pod("c", "14")),
                Advance(2),
            ]
        ],
    )
    source = pod_source(fleet, fake)
    await run_until_exhausted(fake, source)
    assert fleet.source_ids("k8s-pods") == {"uid-c"}
    assert source.status.removed_by_relist == 0


async def test_a_malformed_pod_in_a_list_does_not_hide_the_others() -> None:
    clock = FakeClock()
    fleet = new_fleet()
    broken = pod("broken")
    broken["status"]["podIP"] = "not-an-ip"
    fake = FakeListerWatcher(clock, lists=[([broken, pod("good")], "10")], watches=[])
    source = pod_source(fleet, fake)
    fake.watches.append([Advance(2)])
    await run_until_exhausted(fake, source)
    assert fleet.source_ids("k8s-pods") == {"uid-good"}
    assert source.status.synced


def service(name: str, version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": version,
        },
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "http", "port": 80}]},
    }


def endpoint_slice(service_name: str, ready: bool, version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{service_name}-x",
            "namespace": "default",
            "uid": f"uid-{service_name}-x",
            "resourceVersion": version,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": ready}}],
    }


async def test_a_service_source_joins_only_after_both_lists_and_follows_slice_events() -> None:
    clock = FakeClock()
    fleet = new_fleet()
    services = FakeListerWatcher(clock, lists=[([service("s")], "10")], watches=[[Advance(2)]])
    slices = FakeListerWatcher(
        clock,
        lists=[ApiUnreachable("LIST endpointslices: refused"), ([endpoint_slice("s", True)], "10")],
        watches=[[event("MODIFIED", endpoint_slice("s", False, version="12")), Advance(2)]],
    )
    source = ServiceSource(
        fleet,
        services,
        slices,
        engine_port=SETTINGS.engine_port,
        namespace="default",
        label_selector=SETTINGS.label_selector,
        timing=TIMING,
        clock=clock,
        sleep=clock.sleep,
    )
    readiness: list[bool] = []
    fleet.subscribe(lambda change: readiness.append(fleet.snapshot.by_id["uid-s"].spec.ready))
    task = asyncio.ensure_future(source.run())
    try:
        await asyncio.wait_for(
            asyncio.gather(services.exhausted.wait(), slices.exhausted.wait()), timeout=5
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert readiness == [True, False], "added once both sides were known, then the slice event"
    assert source.status.synced
    assert source.status.relists == {"start": 2, "error": 1, "watch-ended": 2}
    assert source.status.resource_version == "services=10,endpointslices=12"
