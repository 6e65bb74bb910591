"""A hostile run's records and their verdict: what a phase is, what it measured, the report.

The driver (bench/hostile/run.py) runs phases and fills a `PhaseRun` each; here every
run is summarised over its window (attack + aftermath) into a `Row`, judged
against issue 8's targets (the method and the targets are in the driver's
docstring), and rendered as the markdown report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headcount.config import ProxySettings

__all__ = [
    "EVIL_MODEL",
    "SIM_MODEL",
    "Phase",
    "PhaseRun",
    "Row",
    "Sample",
    "Scale",
    "percentile",
    "render",
    "summarise",
]

SIM_MODEL = "sim-model"
EVIL_MODEL = "evil-model"
MIB = 1024 * 1024
BODY_LIMIT_MIB = ProxySettings().max_body_size / MIB
STALL_TARGET_MS = 20.0
P99_BUDGET_MS = 20.0
FD_SLACK = 5
HUNG_GRACE_S = 1.0
HELD_SLACK_MIB = 16.0


@dataclass(frozen=True)
class Phase:
    name: str
    title: str
    attack: str | None = None
    """The client-side attack in bench/hostile/programs/attacks.py, if any."""
    evil_mode: str | None = None
    """The adversarial engine's mode during the attack, if not `healthy`."""
    evil_model: str = EVIL_MODEL
    uploads: str = ""
    """The `Scale` field counting concurrent uploads (the RSS allowance), if any."""
    hold_evil: bool = False
    """Keep the engine's mode until the observer is done (a hung engine stays hung)."""


@dataclass(frozen=True)
class Scale:
    warmup_s: float = 3.0
    attack_s: float = 10.0
    aftermath_s: float = 5.0
    json_clients: int = 4
    chunk_clients: int = 25
    chunk_waves: int = 4
    pipeline_connections: int = 4
    slowloris_connections: int = 500
    idle_connections: int = 2000
    evil_clients: int = 2
    client_timeout_s: float = 30.0
    rate: float = 50.0

    def attack_args(self, attack: str) -> list[str]:
        counts = {
            "json-bodies": ("--clients", self.json_clients),
            "chunk-waves": ("--clients", self.chunk_clients),
            "pipeline": ("--connections", self.pipeline_connections),
            "slowloris": ("--connections", self.slowloris_connections),
            "idle": ("--connections", self.idle_connections),
            "evil-requests": ("--clients", self.evil_clients),
            "desync": ("--clients", self.evil_clients),
        }
        flag, value = counts[attack]
        return [flag, str(value), "--waves", str(self.chunk_waves)]


@dataclass(frozen=True)
class Sample:
    t: float
    rss_mib: float
    fds: int


@dataclass
class PhaseRun:
    """What one phase produced; the report's row is computed from it by `summarise`."""

    phase: Phase
    t_attack: float
    t_stop: float
    t_end: float
    livez: list[tuple[float, float, bool]] = field(default_factory=list)
    normal: list[dict[str, Any]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    attack_stats: dict[str, Any] = field(default_factory=dict)
    evil_stats: dict[str, Any] = field(default_factory=dict)
    evil_engine: dict[str, Any] | None = None
    """The adversarial engine as the router's `/engines` shows it at the end of the attack."""
    probe_error_after_s: float | None = None
    """Hung-engine phase: when `/engines` first showed a probe error for it, from the hang."""
    out_of_rotation_after_s: float | None = None
    """Hung-engine phase: when `/engines` first showed it unhealthy or ejected."""
    router_exit: int | None = None
    """The router's exit code if it died during the phase."""
    notes: list[str] = field(default_factory=list)


# --- the verdict ----------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of `values`; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Row:
    worst_stall_ms: float | None
    p50_ms: float | None
    p99_ms: float | None
    normal_sent: int
    normal_failed: int
    rss_base_mib: float | None
    rss_peak_over_mib: float | None
    rss_after_over_mib: float | None
    fds_base: int | None
    fds_peak: int | None
    fds_after: int | None
    missed: tuple[str, ...]


def summarise(run: PhaseRun, quiet: Row | None, quiet_livez_ms: float | None, scale: Scale) -> Row:
    """One phase's row: its measurements over the window, judged against the targets."""
    window = (run.t_attack, run.t_end)
    livez = [ms for t, ms, _ in run.livez if window[0] <= t < window[1]]
    normal = [r for r in run.normal if window[0] <= r["t"] < window[1]]
    failed = sum(1 for r in normal if r["st"] != 200 or r["err"])
    latencies = [float(r["ms"]) for r in normal]
    worst = max(livez) - (quiet_livez_ms or 0.0) if livez else None
    base = [s for s in run.samples if run.t_attack - 1.0 <= s.t < run.t_attack]
    during = [s for s in run.samples if window[0] <= s.t <= window[1]]
    tail = [s for s in run.samples if window[1] - 1.0 <= s.t <= window[1]]
    rss_base = _median([s.rss_mib for s in base])
    fds_base = int(statistics.median([s.fds for s in base])) if base else None
    peak_over = after_over = None
    if rss_base is not None and during:
        peak_over = max(s.rss_mib for s in during) - rss_base
    if rss_base is not None and tail:
        after_over = statistics.median([s.rss_mib for s in tail]) - rss_base
    fds_after = int(statistics.median([s.fds for s in tail])) if tail else None
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    row = Row(
        worst_stall_ms=worst,
        p50_ms=p50,
        p99_ms=p99,
        normal_sent=len(normal),
        normal_failed=failed,
        rss_base_mib=rss_base,
        rss_peak_over_mib=peak_over,
        rss_after_over_mib=after_over,
        fds_base=fds_base,
        fds_peak=max((s.fds for s in during), default=None),
        fds_after=fds_after,
        missed=(),
    )
    return dataclasses.replace(row, missed=_missed(run, row, quiet, scale))


def _uploads(run: PhaseRun, scale: Scale) -> int:
    return int(getattr(scale, run.phase.uploads)) if run.phase.uploads else 0


def _missed(run: PhaseRun, row: Row, quiet: Row | None, scale: Scale) -> tuple[str, ...]:
    missed: list[str] = [] if run.router_exit is None else ["router died"]
    allowance = 2 * BODY_LIMIT_MIB * max(1, _uploads(run, scale))
    if row.worst_stall_ms is None or row.worst_stall_ms >= STALL_TARGET_MS:
        missed.append("stall")
    quiet_p99 = quiet.p99_ms if quiet is not None else None
    if quiet_p99 is not None and (row.p99_ms is None or row.p99_ms > quiet_p99 + P99_BUDGET_MS):
        missed.append("p99")
    if row.rss_peak_over_mib is None or row.rss_peak_over_mib > allowance:
        missed.append("RSS peak")
    if row.rss_after_over_mib is None or row.rss_after_over_mib > BODY_LIMIT_MIB:
        missed.append("RSS after")
    if row.fds_after is None or row.fds_base is None or row.fds_after > row.fds_base + FD_SLACK:
        missed.append("fds after")
    if row.normal_failed:
        missed.append("failed requests")
    missed += _phase_check(run, row)
    return tuple(missed)


def _phase_check(run: PhaseRun, row: Row) -> list[str]:
    name = run.phase.name
    if name == "b-chunks":
        held = max(run.attack_stats.get("body MiB sent per wave") or [0.0])
        if row.rss_peak_over_mib is None or row.rss_peak_over_mib > 2 * held + HELD_SLACK_MIB:
            return ["RSS per byte held"]
    if name == "f-desync" and run.attack_stats.get("desynced answers", 0):
        return ["desync"]
    if name == "f-nested" and (run.evil_engine or {}).get("state") == "ready":
        return ["probe error not a failure"]
    if name == "g-hung":
        waits = _hung_waits(run)
        if any(r["st"] != 200 or r["err"] for r in waits):
            return ["waits on a known-dead engine"]
        known = run.out_of_rotation_after_s
        if known is not None:
            out_at = run.t_attack + known
            if any(r["t"] + r["ms"] / 1000 > out_at + HUNG_GRACE_S for r in waits):
                return ["waits on a known-dead engine"]
    return []


def _hung_waits(run: PhaseRun) -> list[dict[str, Any]]:
    ids = set(run.evil_stats.get("hung_ids", ()))
    return [r for r in run.normal if r["id"] in ids]


# --- report -----------------------------------------------------------------------


def _f(value: float | None, digits: int = 1, sign: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _row_line(run: PhaseRun, row: Row, quiet: Row | None) -> str:
    quiet_lat = f"{_f(quiet.p50_ms)}/{_f(quiet.p99_ms)}" if quiet else "—"
    verdict = "yes" if not row.missed else "**no**: " + ", ".join(row.missed)
    return (
        f"| {run.phase.name} | {_f(row.worst_stall_ms)} "
        f"| {_f(row.p50_ms)}/{_f(row.p99_ms)} vs {quiet_lat} "
        f"| {_f(row.rss_peak_over_mib, sign=True)} (base {_f(row.rss_base_mib, 0)}) "
        f"| {_f(row.rss_after_over_mib, sign=True)} "
        f"| {row.fds_peak if row.fds_peak is not None else '—'}/"
        f"{row.fds_after if row.fds_after is not None else '—'} (base {row.fds_base}) "
        f"| {row.normal_failed} of {row.normal_sent} | {verdict} |"
    )


def _details(run: PhaseRun, scale: Scale) -> list[str]:
    lines = [f"- **{run.phase.name}** ({run.phase.title})"]
    if run.attack_stats:
        lines.append(f"  - adversary saw: `{json.dumps(run.attack_stats)}`")
    window = [(ms, ok) for t, ms, ok in run.livez if run.t_attack <= t < run.t_end]
    slow = sum(1 for ms, _ in window if ms >= STALL_TARGET_MS)
    lines.append(
        f"  - /livez answers of {STALL_TARGET_MS:g} ms or more: {slow} of {len(window)} "
        "(one alone can be the machine; many are the router)"
    )
    unanswered = sum(1 for _, ok in window if not ok)
    if unanswered:
        lines.append(
            f"  - {unanswered} /livez calls got no answer (connection refused, reset or timeout)"
        )
    engine = run.evil_engine
    if engine is not None and run.phase.evil_mode is not None:
        error = engine.get("last_error")
        lines.append(
            f"  - adversarial engine at the end of the attack: {engine.get('state')}"
            + (f" (`{str(error)[:160]}`)" if error else " (no error)")
        )
    if run.evil_stats.get("seen"):
        lines.append(f"  - adversarial engine was asked: `{json.dumps(run.evil_stats['seen'])}`")
    if run.phase.hold_evil:
        lines.append(f"  - {_hung_summary(run, scale)}")
    failures = [r for r in run.normal if r["t"] >= run.t_attack and (r["st"] != 200 or r["err"])]
    if failures:
        first = failures[0]
        lines.append(
            f"  - first failed normal request: {first['st'] or 'no answer'} after "
            f"{first['ms'] / 1000:.2f} s: `{first['err'][:120]}`"
        )
    lines += [f"  - {note}" for note in run.notes]
    return lines


def _hung_summary(run: PhaseRun, scale: Scale) -> str:
    waits = _hung_waits(run)
    error, out = run.probe_error_after_s, run.out_of_rotation_after_s
    ejected = (
        ("no probe error shown" if error is None else f"a probe error shown after {error:.1f} s")
        + "; "
        + ("never out of rotation" if out is None else f"out of rotation after {out:.1f} s")
        + " (from the hang, polled every 0.5 s)"
    )
    if not waits:
        return f"no normal request reached the hung engine; {ejected}"
    seconds = [r["ms"] / 1000 for r in waits]
    gave_up = sum(1 for r in waits if r["ms"] >= scale.client_timeout_s * 1000 - 50)
    answered = sum(1 for r in waits if r["st"] == 200 and not r["err"])
    return (
        f"{len(waits)} normal requests reached the hung engine; they took p50 "
        f"{_f(percentile(seconds, 50))} s, max {_f(max(seconds))} s; {answered} answered "
        f"(failed over), {gave_up} gave up at the client timeout "
        f"({scale.client_timeout_s:g} s); {ejected}"
    )


def render(
    runs: Sequence[PhaseRun],
    scale: Scale,
    started: str,
    log_dir: Path,
    source: str,
    probe_interval: float,
) -> str:
    quiet_run = next((run for run in runs if run.phase.name == "quiet"), None)
    quiet_livez = None
    quiet: Row | None = None
    if quiet_run is not None:
        window = [ms for t, ms, _ in quiet_run.livez if quiet_run.t_attack <= t < quiet_run.t_end]
        quiet_livez = _median(window)
        quiet = summarise(quiet_run, None, quiet_livez, scale)
    rows = [(run, summarise(run, quiet, quiet_livez, scale)) for run in runs]
    header = [
        f"# Hostile input, {started} UTC",
        "",
        f"- headcount: {source}; body limit {BODY_LIMIT_MIB:g} MiB (default), "
        f"probe interval {probe_interval:g} s, every other setting default",
        f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}; load at the end "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"- per phase: warm-up {scale.warmup_s:g} s, attack {scale.attack_s:g} s, aftermath "
        f"{scale.aftermath_s:g} s (window = attack + aftermath); normal traffic "
        f"{scale.rate:g}/s, client timeout {scale.client_timeout_s:g} s; /livez every 5 ms; "
        f"quiet /livez median {_f(quiet_livez, 2)} ms",
        f"- logs and raw samples: {log_dir}",
        "- method and targets: the docstring of bench/hostile/__init__.py",
        "",
        "| phase | worst stall ms | normal p50/p99 ms during vs quiet "
        "| peak RSS MiB over baseline | RSS after | fds peak/after | failed normal requests "
        "| target met? |",
        "|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    body = [_row_line(run, row, quiet) for run, row in rows]
    details = ["", "## What each phase did and saw", ""]
    for run, _ in rows:
        details += _details(run, scale)
    return "\n".join(header + body + details) + "\n"
