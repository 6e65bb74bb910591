"""Running the routing suite: a router per target, and a measured open-loop run per load.

The method: bench/routing/__init__.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common.gateway import BODY_MODES, start_envoy
from bench.common.harness import HEADCOUNT_BIN, BenchError, say
from bench.common.httpcall import http_call
from bench.common.processes import Proc, Processes, block_until
from bench.common.procfs import tree_cpu_seconds
from bench.routing.fleet import BLOCK_SIZE, ENGINES, MODEL, Engine, counters, reset_caches, served
from bench.routing.loadgen import Outcome, run_open_loop
from bench.routing.report import Recovery, Row, recovery, summarise
from bench.routing.targets import Target
from bench.routing.trace import RunTrace, Schedule, run_trace, schedule_accesses
from bench.routing.workload import Workload, WorkloadShape, arrivals
from headcount.sim.loopback import free_port

__all__ = ["FAULTS", "RunKey", "Settings", "run_target", "schedule_of"]


@dataclass(frozen=True)
class Settings:
    workloads: tuple[Workload, ...]
    rates: tuple[float, ...] | None
    """Every workload's loads, req/s; None: each workload's own (`Workload.rates`)."""
    warmup_requests: int
    requests: int
    """Measured requests per run (per seed): the window lasts `requests / rate` seconds."""
    seeds: int
    """Runs per workload and rate, with seeds from the workload's own up."""
    drain_s: float
    targets: tuple[Target, ...]
    require_peers: bool
    out_dir: Path
    fault: str | None = None
    """Inject this event-stream fault (`FAULTS`) into the first engine a third of the way
    into each measured window, and report TTFT's recovery."""

    def runs(self) -> list[RunKey]:
        """Every run each target makes, in order."""
        return [
            RunKey(workload, rate, workload.shape.seed + offset)
            for workload in self.workloads
            for rate in self.rates or workload.rates
            for offset in range(self.seeds)
        ]


@dataclass(frozen=True)
class RunKey:
    """One run's requests: a workload at a rate with a seed (the same for every target)."""

    workload: Workload
    rate: float
    seed: int


@functools.cache
def schedule_of(key: RunKey, warmup_requests: int, requests: int) -> Schedule:
    """The run's arrivals and their blocks, computed once for every target."""
    warmup_s, duration_s = warmup_requests / key.rate, requests / key.rate
    shape = dataclasses.replace(key.workload.shape, seed=key.seed)
    return schedule_accesses(
        arrivals(shape, MODEL, key.rate, warmup_s + duration_s),
        warmup_s,
        BLOCK_SIZE,
        shape.max_tokens,
    )


FAULTS: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "restart": ({"restart": True}, {}),
    "gap": ({"drop": 3, "replay": False}, {"replay": True}),
}
"""Per fault, the `/sim/kv-events` body that injects it and the one that undoes it after
the run: `restart` is a new engine process (empty cache, sequence from 0), `gap` loses
three batches and leaves replay unanswered, so no subscriber can fill the gap."""


def _probe_ok(port: int, shape: WorkloadShape) -> bool:
    body = arrivals(shape, MODEL, 50.0, 0.05)[0].body
    answer = http_call(port, "POST", "/v1/chat/completions", body, timeout_s=10)
    return answer is not None and answer.ok and b"[DONE]" in answer.body


def start_router(
    procs: Processes, target: Target, engines: Sequence[Engine], shape: WorkloadShape
) -> tuple[Proc, Proc | None, int]:
    """The router, Envoy in front of it when the target is `behind_envoy`, the client port."""
    port, metrics = free_port(), free_port()
    log_name = re.sub(r"[^A-Za-z0-9_.-]+", "-", target.name)
    gateway = None
    if target.behind_envoy:
        picker = free_port()
        proc = procs.start(log_name, target.command(picker, metrics, engines))
        gateway = start_envoy(
            procs,
            f"{log_name}-envoy",
            listen_port=port,
            picker_port=picker,
            body_modes=BODY_MODES["full-duplex"],
            directory=procs.log_dir,
        )
    else:
        proc = procs.start(log_name, target.command(port, metrics, engines), port)
    block_until(lambda: _probe_ok(port, shape), 60, f"{target.name} to answer a chat", proc)
    if target.program == HEADCOUNT_BIN:
        # Until every engine is ready, headcount routes over the ones it has probed.
        admin = metrics if target.behind_envoy else port
        block_until(
            lambda: (
                (a := http_call(admin, "GET", "/engines")) is not None
                and a.body.count(b'"ready"') >= ENGINES
            ),
            30,
            f"{target.name} to list {ENGINES} ready engines",
            proc,
        )
    return proc, gateway, port


def measure(
    target: Target,
    key: RunKey,
    router: Proc,
    port: int,
    engines: Sequence[Engine],
    settings: Settings,
    recoveries: list[Recovery],
) -> tuple[Row, RunTrace]:
    """One measured run; with `settings.fault`, its recovery is appended to `recoveries`."""
    reset_caches(engines)
    rate = key.rate
    warmup_s, duration_s = settings.warmup_requests / rate, settings.requests / rate
    schedule = schedule_of(key, settings.warmup_requests, settings.requests)
    marks: dict[str, object] = {}

    async def at_window_start() -> None:
        marks["counters"] = counters(engines)
        marks["cpu"] = tree_cpu_seconds(router.pid)
        marks["served"] = served(engines)

    hooks: list[tuple[float, Callable[[], Awaitable[None]]]] = [(warmup_s, at_window_start)]
    fault_s = warmup_s + duration_s / 3
    if settings.fault is not None:
        inject, undo = (json.dumps(body).encode() for body in FAULTS[settings.fault])

        async def at_fault() -> None:
            if engines[0].call("POST", "/sim/kv-events", inject) is None:
                raise BenchError(f"{engines[0].proc.name}: the fault was not injected")

        hooks.append((fault_s, at_fault))
    outcomes: list[Outcome] = asyncio.run(
        run_open_loop(f"http://127.0.0.1:{port}", schedule.arrivals, settings.drain_s, hooks)
    )
    if settings.fault is not None:
        engines[0].call("POST", "/sim/kv-events", undo)
        recoveries.append(
            recovery(
                f"{key.workload.name}: {target.name}",
                rate,
                settings.fault,
                outcomes,
                (warmup_s, fault_s, warmup_s + duration_s),
            )
        )
    if not router.alive():
        raise BenchError(f"{router.name} exited:\n{router.log_tail()}")
    hits, queries = counters(engines)
    hits0, queries0 = marks.get("counters", (0.0, 0.0))  # type: ignore[misc]
    cpu = tree_cpu_seconds(router.pid) - float(marks.get("cpu", 0.0))  # type: ignore[arg-type]
    split_now = served(engines)
    split_then = marks.get("served", [0] * ENGINES)
    deltas = [a - b for a, b in zip(split_now, split_then, strict=True)]  # type: ignore[call-overload]
    split = "/".join(f"{100 * d / sum(deltas):.0f}" for d in deltas) if sum(deltas) else "—"
    measured = [o for o in outcomes if o.arrival.at_s >= warmup_s]
    hit_rate = (hits - hits0) / (queries - queries0) if queries > queries0 else None
    row = summarise(
        key.workload.name, target.name, rate, measured, duration_s, hit_rate, cpu, split
    )
    names = [engine.proc.name for engine in engines]
    return dataclasses.replace(row, seed=key.seed), run_trace(schedule, outcomes, names)


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def run_target(
    procs: Processes,
    target: Target,
    engines: Sequence[Engine],
    settings: Settings,
    recoveries: list[Recovery],
) -> list[tuple[RunKey, Row, RunTrace]]:
    router, gateway, port = start_router(procs, target, engines, settings.workloads[0].shape)
    done = []
    try:
        for key in settings.runs():
            row, trace = measure(target, key, router, port, engines, settings, recoveries)
            say(
                f"{key.workload.name:<9} {target.name:<26} {key.rate:5g} req/s seed {key.seed}: "
                f"TTFT mean {_f(row.ttft_mean)} p90 {_f(row.ttft_p90)} hit {_f(row.hit_rate)} "
                f"failed {row.failed}/{row.sent} lag p99 {row.lag_p99_ms:.1f} ms"
            )
            done.append((key, row, trace))
    finally:
        if gateway is not None:
            procs.stop(gateway)
        procs.stop(router)
    return done
