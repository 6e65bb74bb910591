"""Running the overload suite: a router per target, its load points, then its main run.

The method: bench/overload/__init__.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common.harness import BenchError, say
from bench.common.httpcall import http_call
from bench.common.processes import Proc, Processes, block_until
from bench.overload.fleet import ENGINES, Engine
from bench.overload.targets import Target
from bench.overload.tenants import BATCH, CAPPED, INTERACTIVE, TENANTS, request_body
from bench.overload.traffic import FULL_FLOOD, Plan, Traffic, run_traffic
from headcount.sim.loopback import free_port

__all__ = ["Measured", "Settings", "run_target"]

_PROBE_HEADERS = {"Authorization": f"Bearer {INTERACTIVE.key}"}
FIRST_WARMUP_S = 10.0
"""Added to a router's first warm-up: headcount-flow learns an engine's capacity when it
first sees it saturated (running while some wait), and until then sends on into the
engines' queues (a 1x flood straight after start: interactive TTFT p90 1.3 s, 0.5 s once
learned). The load points measure load, not that."""


@dataclass(frozen=True)
class Settings:
    targets: tuple[Target, ...]
    warmup_s: float
    phases_s: tuple[float, float]
    drain_s: float
    points: tuple[float, ...]
    """Floods (multiples of capacity) measured besides the main run's, for the plot."""
    point_warmup_s: float
    point_s: float
    out_dir: Path
    require_peers: bool


@dataclass
class Measured:
    target: Target
    main: Traffic | None = None
    points: dict[float, Traffic] = field(default_factory=dict)
    """Flood → the interactive and batch tenants' run at it (the main run's flood included)."""


def _answers(port: int) -> bool:
    body = request_body(INTERACTIVE, -1)
    answer = http_call(port, "POST", "/v1/chat/completions", body, 10, headers=_PROBE_HEADERS)
    return answer is not None and answer.ok and b"[DONE]" in answer.body


def _lists_engines(port: int) -> bool:
    answer = http_call(port, "GET", "/engines", headers=_PROBE_HEADERS)
    return answer is not None and answer.ok and answer.body.count(b'"ready"') >= ENGINES


def _start(
    procs: Processes, target: Target, engines: Sequence[Engine], files: Path
) -> tuple[Proc, int]:
    port, metrics = free_port(), free_port()
    proc = procs.start(target.name, target.command(port, metrics, engines, files), port)
    block_until(functools.partial(_answers, port), 60, f"{target.name} to answer a chat", proc)
    if target.program.name == "headcount":
        block_until(
            functools.partial(_lists_engines, port),
            30,
            f"{target.name} to list {ENGINES} ready engines",
            proc,
        )
    return proc, port


def _idle(engine: Engine) -> bool:
    answer = http_call(engine.port, "GET", "/sim/stats")
    if answer is None or not answer.ok:
        return False
    stats = json.loads(answer.body)
    return stats.get("running") == 0 and stats.get("waiting") == 0


def _settle(engines: Sequence[Engine]) -> None:
    """Every engine idle: nothing one run left behind runs into the next."""
    for engine in engines:
        block_until(functools.partial(_idle, engine), 60, f"{engine.proc.name} to go idle")


def _plans(target: Target, settings: Settings) -> list[tuple[float, Plan]]:
    """(flood, plan) in the order run: the load points, lowest first, then the main run."""
    if target.alone:
        window = (2 * settings.point_s, 0.0)
        return [(0.0, Plan((INTERACTIVE,), 0.0, settings.warmup_s, window, settings.drain_s))]
    plans = [
        (
            flood,
            Plan(
                (INTERACTIVE, *BATCH),
                flood,
                settings.point_warmup_s,
                (settings.point_s, 0.0),
                settings.drain_s,
            ),
        )
        for flood in sorted(settings.points)
    ]
    steady = CAPPED if target.limits else None
    main = Plan(TENANTS, FULL_FLOOD, settings.warmup_s, settings.phases_s, settings.drain_s, steady)
    return [*plans, (FULL_FLOOD, main)]


def run_target(
    procs: Processes, target: Target, engines: Sequence[Engine], settings: Settings, files: Path
) -> Measured:
    """Start `target`, run its load points and its main run on it, stop it."""
    _settle(engines)
    router, port = _start(procs, target, engines, files)
    measured = Measured(target)
    try:
        for index, (flood, plan) in enumerate(_plans(target, settings)):
            if index == 0:
                plan = dataclasses.replace(plan, warmup_s=plan.warmup_s + FIRST_WARMUP_S)
            _settle(engines)
            traffic = asyncio.run(run_traffic(f"http://127.0.0.1:{port}", plan, engines))
            if not router.alive():
                raise BenchError(f"{router.name} exited:\n{router.log_tail()}")
            measured.points[flood] = traffic
            if plan.tenants == TENANTS or target.alone:
                measured.main = traffic
            say(f"{target.name:<15} flood {flood:g}x: {_progress(traffic)}")
    finally:
        procs.stop(router)
    return measured


def _progress(traffic: Traffic) -> str:
    served = sum(1 for o in traffic.outcomes if o.served)
    lost = sum(1 for o in traffic.outcomes if o.lost)
    refused = len(traffic.outcomes) - served - lost
    low, high = traffic.measured
    return f"{served} served, {refused} refused, {lost} lost; window {low:.0f}-{high:.0f} s"
