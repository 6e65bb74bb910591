"""Running the routing suite: a router per target, and a measured open-loop run per load.

The method: bench/routing/__init__.py.
"""

from __future__ import annotations

import asyncio
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
from bench.routing.fleet import ENGINES, MODEL, Engine, counters, reset_caches, served
from bench.routing.loadgen import Outcome, run_open_loop
from bench.routing.report import Recovery, Row, recovery, summarise
from bench.routing.targets import Target
from bench.routing.workload import Workload, WorkloadShape, arrivals
from headcount.sim.loopback import free_port

__all__ = ["FAULTS", "Settings", "run_target"]


@dataclass(frozen=True)
class Settings:
    workloads: tuple[Workload, ...]
    rates: tuple[float, ...] | None
    """Every workload's loads, req/s; None: each workload's own (`Workload.rates`)."""
    warmup_requests: int
    duration_s: float
    drain_s: float
    targets: tuple[Target, ...]
    require_peers: bool
    out_dir: Path
    fault: str | None = None
    """Inject this event-stream fault (`FAULTS`) into the first engine a third of the way
    into each measured window, and report TTFT's recovery."""

    def rates_of(self, workload: Workload) -> tuple[float, ...]:
        return self.rates or workload.rates


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
    workload: Workload,
    rate: float,
    router: Proc,
    port: int,
    engines: Sequence[Engine],
    settings: Settings,
    recoveries: list[Recovery],
) -> Row:
    """One measured run; with `settings.fault`, its recovery is appended to `recoveries`."""
    reset_caches(engines)
    warmup_s = settings.warmup_requests / rate
    schedule = arrivals(workload.shape, MODEL, rate, warmup_s + settings.duration_s)
    marks: dict[str, object] = {}

    async def at_window_start() -> None:
        marks["counters"] = counters(engines)
        marks["cpu"] = tree_cpu_seconds(router.pid)
        marks["served"] = served(engines)

    hooks: list[tuple[float, Callable[[], Awaitable[None]]]] = [(warmup_s, at_window_start)]
    fault_s = warmup_s + settings.duration_s / 3
    if settings.fault is not None:
        inject, undo = (json.dumps(body).encode() for body in FAULTS[settings.fault])

        async def at_fault() -> None:
            if engines[0].call("POST", "/sim/kv-events", inject) is None:
                raise BenchError(f"{engines[0].proc.name}: the fault was not injected")

        hooks.append((fault_s, at_fault))
    outcomes: list[Outcome] = asyncio.run(
        run_open_loop(f"http://127.0.0.1:{port}", schedule, settings.drain_s, hooks)
    )
    if settings.fault is not None:
        engines[0].call("POST", "/sim/kv-events", undo)
        recoveries.append(
            recovery(
                f"{workload.name}: {target.name}",
                rate,
                settings.fault,
                outcomes,
                (warmup_s, fault_s, warmup_s + settings.duration_s),
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
    return summarise(
        workload.name, target.name, rate, measured, settings.duration_s, hit_rate, cpu, split
    )


def run_target(
    procs: Processes,
    target: Target,
    engines: Sequence[Engine],
    settings: Settings,
    recoveries: list[Recovery],
) -> list[Row]:
    router, gateway, port = start_router(procs, target, engines, settings.workloads[0].shape)
    rows = []
    cells = [(w, rate) for w in settings.workloads for rate in settings.rates_of(w)]
    try:
        for workload, rate in cells:
            row = measure(target, workload, rate, router, port, engines, settings, recoveries)
            say(
                f"{workload.name:<9} {target.name:<26} {rate:5g} req/s: TTFT p50 {row.ttft_p50} "
                f"p90 {row.ttft_p90} hit {row.hit_rate} failed {row.failed}/{row.sent} "
                f"lag p99 {row.lag_p99_ms:.1f} ms"
            )
            rows.append(row)
    finally:
        if gateway is not None:
            procs.stop(gateway)
        procs.stop(router)
    return rows
