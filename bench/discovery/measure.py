"""The discovery suite's measurements: each phase timed from the driver, and what a run yields.

The phases (in the order of bench/discovery/__init__.py): initial sync, no-change
relist, watch events (burst and live, each with and without a snapshot reader),
tracemalloc peak, time to truth after a blind period. The worker
(`programs/worker.py`) times its own side; here the driver's clock and the
emulator's CPU meet its answers.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common.processes import Processes
from bench.common.procfs import tree_cpu_seconds
from bench.discovery.scenario import Cluster, JsonObject, Worker, emulator

__all__ = [
    "EVENTS",
    "Burst",
    "EventsResult",
    "ListPieces",
    "Live",
    "Plan",
    "RelistResult",
    "RunResult",
    "SyncResult",
    "TruthResult",
    "measure_size",
]

EVENTS = 2000
DELETE_FRACTION = 0.1
REFUSE_RANGE_S = (2.5, 3.5)
MIB = 1024.0 * 1024.0


@dataclass(frozen=True)
class ListPieces:
    """Where one LIST's time went in the worker (see `programs/worker.py`), in seconds."""

    request_s: float
    parse_s: float
    map_s: float
    reconcile_s: float
    gc_s: float
    """Of parse + map + reconcile, the cyclic GC's share."""
    body_mib: float

    @classmethod
    def from_answer(cls, answer: JsonObject) -> ListPieces:
        return cls(
            answer["request_s"],
            answer["parse_s"],
            answer["map_s"],
            answer["reconcile_s"],
            answer["gc_s"],
            answer["body_bytes"] / MIB,
        )


@dataclass(frozen=True)
class SyncResult:
    seconds: float
    rss_peak_mib: float
    """VmHWM after the sync minus VmRSS before it, in a fresh worker process."""
    rss_retained_mib: float
    traced_peak_mib: float
    traced_retained_mib: float
    pieces: ListPieces


@dataclass(frozen=True)
class RelistResult:
    seconds: float
    """Watch dropped -> the relist's LIST applied."""
    to_probe: int
    changes: int
    """Engines added, changed or removed by the relist: 0 when nothing changed."""
    error_relists: int
    pieces: ListPieces


@dataclass(frozen=True)
class Burst:
    """M events queued behind a stalled watch, then released at once."""

    per_s: float
    router_us_per_event: float
    """Worker CPU per event: the steadiest number; 1e6 / it is the router's ceiling."""
    router_cpu: float
    """Worker CPU seconds / wall seconds: near 1 means the router was the limit."""
    emulator_cpu: float
    rebuilds: int
    """Snapshot rebuilds, when a reader ran."""


@dataclass(frozen=True)
class Live:
    """M patches sent as fast as the driver can, each event reaching the router as it happens."""

    per_s: float
    sent_per_s: float
    """How fast the driver got the emulator to take the patches: the ceiling for `per_s`."""
    lag_s: float
    """Last patch answered -> last change applied: how far behind the router was."""
    rebuilds: int
    rebuild_ms: float
    """Mean cost of one snapshot rebuild, when a reader ran."""


@dataclass(frozen=True)
class EventsResult:
    burst: Burst
    burst_read: Burst
    """With a snapshot read per loop turn that changed the fleet (as under request traffic)."""
    live: Live
    live_read: Live


@dataclass(frozen=True)
class TruthResult:
    refused_s: float
    seconds: float
    """API reachable again -> the fleet equal to the truth."""
    wait_s: float
    """Reachable -> the LIST that found the truth started: the back-off's share."""
    apply_s: float
    """That LIST's start -> the truth applied."""
    pieces: ListPieces
    blind: bool
    """Before the refusal, the fleet still held every deleted pod: the router was blind."""
    exact: bool
    """After it, the fleet's engines are exactly the pods left."""


@dataclass(frozen=True)
class RunResult:
    """One run at one size."""

    size: int
    sync: SyncResult
    relist: RelistResult
    events: EventsResult
    truth: TruthResult


async def _measure_relist(cluster: Cluster, worker: Worker) -> RelistResult:
    armed = await worker.ask("relist_arm")
    dropped_at = time.monotonic()
    await cluster.fault("drop-watches")
    relist = await worker.ask("relist_await", since=dropped_at, relists=armed["relists"])
    return RelistResult(
        seconds=relist["applied_at"] - dropped_at,
        to_probe=relist["to_probe"],
        changes=relist["added"] + relist["changed"] + relist["removed"],
        error_relists=relist["errors"],
        pieces=ListPieces.from_answer(relist["list"]),
    )


async def _burst(cluster: Cluster, worker: Worker, events: int, tag: str, reader: bool) -> Burst:
    await cluster.fault("stall")
    await cluster.relabel(sorted(cluster.uids), events, tag)
    await worker.ask("events_arm", count=events, phase=f"burst{'-read' * reader}", reader=reader)
    emulator_cpu = tree_cpu_seconds(cluster.proc.pid)
    restored_at = time.monotonic()
    await cluster.fault("restore")
    burst = await worker.ask("events_await")
    seconds = burst["last_at"] - restored_at
    emulator_cpu = tree_cpu_seconds(cluster.proc.pid) - emulator_cpu
    return Burst(
        per_s=events / seconds,
        router_us_per_event=burst["cpu_s"] / events * 1e6,
        router_cpu=burst["cpu_s"] / seconds,
        emulator_cpu=emulator_cpu / seconds,
        rebuilds=burst["rebuilds"],
    )


async def _live(cluster: Cluster, worker: Worker, events: int, tag: str, reader: bool) -> Live:
    await worker.ask("events_arm", count=events, phase=f"live{'-read' * reader}", reader=reader)
    sent_from = time.monotonic()
    await cluster.relabel(sorted(cluster.uids), events, tag)
    sent_at = time.monotonic()
    live = await worker.ask("events_await")
    return Live(
        per_s=events / (live["last_at"] - sent_from),
        sent_per_s=events / (sent_at - sent_from),
        lag_s=live["last_at"] - sent_at,
        rebuilds=live["rebuilds"],
        rebuild_ms=live["rebuild_s"] / max(1, live["rebuilds"]) * 1000,
    )


async def _measure_events(
    cluster: Cluster, worker: Worker, events: int, rng: random.Random
) -> EventsResult:
    def tag(kind: str) -> str:
        return f"{kind}{rng.randrange(10**9)}"

    return EventsResult(
        burst=await _burst(cluster, worker, events, tag("b"), reader=False),
        burst_read=await _burst(cluster, worker, events, tag("br"), reader=True),
        live=await _live(cluster, worker, events, tag("l"), reader=False),
        live_read=await _live(cluster, worker, events, tag("lr"), reader=True),
    )


async def _measure_truth(
    cluster: Cluster, worker: Worker, size: int, rng: random.Random
) -> TruthResult:
    await cluster.fault("stall")
    doomed = rng.sample(sorted(cluster.uids), max(1, round(size * DELETE_FRACTION)))
    deleted = await cluster.delete(doomed)
    armed = await worker.ask("truth_arm", deleted=deleted)
    refuse_s = round(rng.uniform(*REFUSE_RANGE_S), 3)
    await cluster.fault("refuse", seconds=refuse_s)
    reachable_at = await cluster.wait_refused_then_reachable(refuse_s + 10)
    truth = await worker.ask("truth_await")
    await cluster.create(doomed)
    return TruthResult(
        refused_s=refuse_s,
        seconds=truth["truth_at"] - reachable_at,
        wait_s=truth["list_started"] - reachable_at,
        apply_s=truth["truth_at"] - truth["list_started"],
        pieces=ListPieces.from_answer(truth["list"]),
        blind=armed["blind"] and armed["engines"] == size,
        exact=truth["exact"],
    )


async def _measure_run(
    cluster: Cluster, worker: Worker, size: int, events: int, rng: random.Random
) -> RunResult:
    """Every phase, in the order bench/discovery/__init__.py gives."""
    sync = await worker.ask("sync", expect=size)
    relist = await _measure_relist(cluster, worker)
    events_result = await _measure_events(cluster, worker, events, rng)
    traced = await worker.ask("traced_sync", expect=size)
    truth = await _measure_truth(cluster, worker, size, rng)
    sync_result = SyncResult(
        seconds=sync["sync_s"],
        rss_peak_mib=sync["rss_peak_delta_kib"] / 1024,
        rss_retained_mib=sync["rss_retained_kib"] / 1024,
        traced_peak_mib=traced["traced_peak_bytes"] / MIB,
        traced_retained_mib=traced["traced_retained_bytes"] / MIB,
        pieces=ListPieces.from_answer(sync["list"]),
    )
    return RunResult(size, sync_result, relist, events_result, truth)


@dataclass(frozen=True)
class Plan:
    """What every size gets: how many runs, how many events, which back-off, where logs go."""

    runs: int
    events: int
    backoff_max: float
    log_dir: Path
    profile_size: int | None
    """The size that gets one more, cProfile'd, run; None: no profiling."""

    def profile_dir(self, size: int) -> Path:
        return self.log_dir / f"profile-{size}"


async def measure_size(
    procs: Processes, plan: Plan, size: int, rng: random.Random
) -> list[RunResult]:
    """Every run at one size, against one emulator holding `size` pods."""
    results: list[RunResult] = []
    async with emulator(procs, plan.log_dir, size) as cluster:
        loaded_from = time.monotonic()
        await cluster.create(f"engine-{i:05d}" for i in range(size))
        print(f"  {size} pods created in {time.monotonic() - loaded_from:.1f} s", flush=True)
        for run in range(plan.runs + (plan.profile_size == size)):
            profiled = run == plan.runs
            log_path = plan.log_dir / f"worker-{size}-{'profile' if profiled else run}.log"
            profile_dir = plan.profile_dir(size) if profiled else None
            if profile_dir is not None:
                profile_dir.mkdir(parents=True, exist_ok=True)
            worker = await Worker.start(cluster.kubeconfig, plan.backoff_max, log_path, profile_dir)
            try:
                result = await _measure_run(cluster, worker, size, plan.events, rng)
            finally:
                await worker.close()
            label = "profiled run" if profiled else f"run {run + 1}/{plan.runs}"
            print(f"  {label}: {_one_line(result)}", flush=True)
            if not profiled:
                results.append(result)
    return results


def _one_line(r: RunResult) -> str:
    return (
        f"sync {r.sync.seconds:.3f} s, relist {r.relist.seconds:.3f} s "
        f"({r.relist.to_probe} to probe), burst {r.events.burst.per_s:,.0f} ev/s "
        f"(with reader {r.events.burst_read.per_s:,.0f}), live {r.events.live.per_s:,.0f} ev/s "
        f"(with reader {r.events.live_read.per_s:,.0f}), truth {r.truth.seconds:.3f} s "
        f"(wait {r.truth.wait_s:.3f} + LIST→applied {r.truth.apply_s:.3f})"
    )
