"""A soak's result and its report: the checks, the totals, the failures and the chaos timeline."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.soak.chaos import Chaos
from bench.soak.traffic import Outcome

__all__ = ["FAILOVERS", "RELISTS", "Check", "Result", "render"]

FAILOVERS = "headcount_upstream_failovers_total"
RELISTS = "headcount_discovery_relists_total"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Result:
    checks: list[Check] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    failed_with_healthy: list[Outcome] = field(default_factory=list)
    excused: list[Outcome] = field(default_factory=list)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    baseline: tuple[float, int] | None = None
    final: tuple[float, int] | None = None
    peak_rss_mib: float = 0.0
    chaos: Chaos | None = None
    t0: float = 0.0
    elapsed_s: float = 0.0


def render(result: Result, setup: Sequence[str], started: str) -> str:
    """The report: `setup` (bullet lines saying what ran), the checks, totals, failures,
    the chaos timeline."""
    chaos = result.chaos
    assert chaos is not None
    outcomes = result.outcomes
    by_kind = Counter(o.kind for o in outcomes)
    streams = sum(1 for o in outcomes if o.stream)
    verdict = "all checks pass" if all(c.ok for c in result.checks) else "**a check failed**"
    lines = [
        f"# Chaos soak, {started} UTC: {verdict}",
        "",
        *setup,
        "",
        "## Checks",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *(f"| {c.name} | {'ok' if c.ok else '**FAIL**'} | {c.detail} |" for c in result.checks),
        "",
        "## Totals",
        "",
        f"- requests: {len(outcomes)} ({streams} streaming): {by_kind['ok']} ok, "
        f"{by_kind['cut']} cut mid-answer, {by_kind['aborted']} abandoned by the client, "
        f"{len(result.failed_with_healthy)} failed while a healthy engine existed, "
        f"{len(result.excused)} failed with none",
        f"- failovers: {_labelled(result.metrics.get(FAILOVERS, {}))}",
        f"- relists: {_labelled(result.metrics.get(RELISTS, {}))}",
        f"- chaos: {', '.join(f'{k} {n}' for k, n in sorted(chaos.counts.items())) or 'none'}",
        f"- API outages (length -> time to truth after it): {_outages(chaos.outages)}",
        f"- router RSS/fds: baseline {_pair(result.baseline)}, final {_pair(result.final)}, "
        f"peak RSS {result.peak_rss_mib:.1f} MiB",
    ]
    lines += _failures_section(result, chaos) + _timeline_section(chaos, result.t0)
    return "\n".join(lines) + "\n"


def _labelled(samples: dict[str, float]) -> str:
    if not samples:
        return "0"
    total = sum(samples.values())
    parts = ", ".join(f"{labels or 'all'}: {value:g}" for labels, value in sorted(samples.items()))
    return f"{total:g} ({parts})"


def _outages(outages: list[tuple[float, float | None]]) -> str:
    if not outages:
        return "none"
    parts = [
        f"{length:.1f} s -> {'never' if t is None else f'{t * 1000:.0f} ms'}"
        for length, t in outages
    ]
    times = [t for _, t in outages if t is not None]
    median = f"; median {statistics.median(times) * 1000:.0f} ms" if times else ""
    return ", ".join(parts) + median


def _pair(measured: tuple[float, int] | None) -> str:
    return "—" if measured is None else f"{measured[0]:.1f} MiB / {measured[1]} fds"


def _failures_section(result: Result, chaos: Chaos) -> list[str]:
    shown = result.failed_with_healthy[:20]
    if not shown and not result.excused:
        return []
    kinds = Counter(
        kind
        for o in result.failed_with_healthy
        for kind in {what.split(" engine")[0] for what in chaos.in_progress(o.start)}
    )
    lines = ["", "## Failed requests (the first 20 while a healthy engine existed)", ""]
    if kinds:
        lines.append(
            "- faults in progress when they began (a request may see several): "
            + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())
        )
    lines += [
        f"- #{o.number} at +{o.start - result.t0:.1f} s, {o.end - o.start:.2f} s, "
        f"{'stream' if o.stream else 'chat'}, during {', '.join(chaos.in_progress(o.start))}: "
        f"{o.detail[:160]}"
        for o in shown
    ]
    lines += [
        f"- excused (no engine healthy at some moment): #{o.number} at "
        f"+{o.start - result.t0:.1f} s, {o.end - o.start:.2f} s: {o.detail[:120]}"
        for o in result.excused[:10]
    ]
    return lines


def _timeline_section(chaos: Chaos, t0: float) -> list[str]:
    lines = ["", "## Chaos timeline", "", "```"]
    lines += [f"+{at - t0:7.1f} s  {kind:<26} {what}" for at, kind, what in chaos.events]
    return [*lines, "```"]
