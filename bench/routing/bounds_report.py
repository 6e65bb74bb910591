"""The report's offline part: per workload and load, the bounds, each router against them, and why.

What the numbers are: bench/routing/bounds.py; how they are computed:
`cache_model.py`, `assignment.py`, `misses.py`. Means over seeds ± the 95 %
interval (`intervals.py`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.routing.bounds import (
    MODEL_CAPACITY,
    ScheduleBounds,
    TraceCheck,
    check_trace,
    schedule_bounds,
)
from bench.routing.fleet import ENGINES
from bench.routing.intervals import interval
from bench.routing.run import RunKey
from bench.routing.trace import RunTrace

__all__ = ["Analysed", "analyse", "render_bounds"]


@dataclass(frozen=True)
class Analysed:
    """One target's run of one schedule, beside that schedule's bounds."""

    target: str
    key: RunKey
    bounds: ScheduleBounds
    check: TraceCheck


def analyse(runs: Sequence[tuple[str, RunKey, RunTrace]]) -> list[Analysed]:
    """Each (target, run, trace) beside its schedule's bounds, computed once per schedule."""
    bounds: dict[RunKey, ScheduleBounds] = {}
    analysed = []
    for target, key, trace in runs:
        if key not in bounds:
            arrivals = trace.schedule.arrivals
            bounds[key] = schedule_bounds(
                trace.schedule,
                [a.tenant for a in arrivals],
                [a.conversation for a in arrivals],
                key.seed,
            )
        analysed.append(Analysed(target, key, bounds[key], check_trace(trace, bounds[key])))
    return analysed


def _pct(values: Sequence[float | None]) -> str:
    known = [100 * v for v in values if v is not None]
    if not known:
        return "—"
    mean, half = interval(known)
    return f"{mean:.1f}" + ("" if half is None else f" ± {half:.1f}")


def _layout(bounds: ScheduleBounds) -> str:
    homes = bounds.fixed.homes
    held = [
        ",".join(str(tenant) for tenant, own in enumerate(homes) if engine in own)
        for engine in range(ENGINES)
    ]
    return "; ".join(
        f"engine {engine + 1} ({load} req): tenants {tenants or '—'}"
        for engine, (tenants, load) in enumerate(zip(held, bounds.fixed.loads, strict=True))
    )


def render_bounds(workload: str, analysed: Sequence[Analysed]) -> str:
    """The section of one workload (from `analysed`, its runs at every rate and seed)."""
    analysed = [a for a in analysed if a.key.workload.name == workload]
    if not analysed:
        return ""
    lines = [
        f"### `{workload}`: hits against the offline bounds",
        "",
        f"Cache model: {ENGINES} engines x {MODEL_CAPACITY} blocks, LRU as the simulator's pool; "
        f"pooled bound: one cache of {ENGINES * MODEL_CAPACITY} blocks, Belady eviction; best "
        "fixed assignment: tenants on 1-2 home engines, each engine's measured requests within "
        "±10 % of the mean, local search. Hit and miss shares are % of the measured prompt tokens.",
        "",
    ]
    for rate in sorted({a.key.rate for a in analysed}):
        at_rate = [a for a in analysed if a.key.rate == rate]
        schedules = {a.key.seed: a.bounds for a in at_rate}
        pooled = _pct([b.pooled_rate for b in schedules.values()])
        pooled_lru = _pct([b.pooled_lru_rate for b in schedules.values()])
        fixed = _pct([b.fixed_rate for b in schedules.values()])
        infeasible = sum(1 for b in schedules.values() if b.fixed.violation)
        lines += [
            f"At {rate:g} req/s over {len(schedules)} seed(s): pooled bound {pooled} % hits "
            f"(the same pooled cache under LRU: {pooled_lru} %), best fixed assignment {fixed} %"
            + (f" ({infeasible} not within the load bound)" if infeasible else "")
            + ".",
            "",
            "| target | hits, engines % | hits, model % | model - engines | compulsory % "
            "| capacity % | routing % | fixed assignment - engines | pooled bound - engines |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for target in dict.fromkeys(a.target for a in at_rate):
            own = [a for a in at_rate if a.target == target]
            checks = [a.check for a in own]
            error = [
                c.model_rate - c.measured_rate
                for c in checks
                if c.model_rate is not None and c.measured_rate is not None
            ]
            misses = [c.misses for c in checks]
            to_fixed = [
                a.bounds.fixed_rate - a.check.measured_rate
                for a in own
                if a.check.measured_rate is not None
            ]
            to_pooled = [
                a.bounds.pooled_rate - a.check.measured_rate
                for a in own
                if a.check.measured_rate is not None
            ]
            lines.append(
                f"| {target} | {_pct([c.measured_rate for c in checks])} "
                f"| {_pct([c.model_rate for c in checks])} "
                f"| {_signed(error)} "
                f"| {_pct([m.share(m.compulsory) for m in misses])} "
                f"| {_pct([m.share(m.capacity) for m in misses])} "
                f"| {_pct([m.share(m.routing) for m in misses])} "
                f"| {_signed(to_fixed)} | {_signed(to_pooled)} |"
            )
        first = min(schedules)
        lines += ["", f"Best fixed assignment, seed {first}: {_layout(schedules[first])}.", ""]
    return "\n".join(lines)


def _signed(values: Sequence[float]) -> str:
    return f"{100 * statistics.fmean(values):+.1f} pt" if values else "—"
