"""The discovery suite's report: medians per size, the goals met or missed, every run, profiles."""

from __future__ import annotations

import argparse
import datetime
import io
import os
import platform
import pstats
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from bench.discovery.measure import ListPieces, RunResult
from bench.discovery.scenario import BACKOFF_INITIAL_S

__all__ = ["Goals", "profile_section", "render"]


@dataclass(frozen=True)
class Goals:
    """The issue's targets, in seconds."""

    sync_s: float = 2.0
    sync_size: int = 5000
    relist_s: float = 0.5
    truth_s: float = 1.0


def _median(values: Iterable[float]) -> float:
    return statistics.median(values)


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _summary_table(by_size: dict[int, list[RunResult]]) -> list[str]:
    lines = [
        "| pods | initial sync | tracemalloc peak / retained | RSS peak Δ / retained "
        "| no-change relist | engines to probe on relist | time to truth (back-off wait + "
        "LIST→applied) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, runs in by_size.items():
        sync = [r.sync for r in runs]
        truth = [r.truth for r in runs]
        lines.append(
            f"| {size:,} | {_median(s.seconds for s in sync):.3f} s "
            f"| {_median(s.traced_peak_mib for s in sync):.1f} / "
            f"{_median(s.traced_retained_mib for s in sync):.1f} MiB "
            f"| {_median(s.rss_peak_mib for s in sync):.1f} / "
            f"{_median(s.rss_retained_mib for s in sync):.1f} MiB "
            f"| {_median(r.relist.seconds for r in runs):.3f} s "
            f"| {max(r.relist.to_probe for r in runs)} "
            f"| {_median(t.seconds for t in truth):.3f} s "
            f"({_median(t.wait_s for t in truth):.3f} + {_median(t.apply_s for t in truth):.3f}) |"
        )
    return lines


def _events_table(by_size: dict[int, list[RunResult]]) -> list[str]:
    lines = [
        "| pods | burst events/s | router CPU per event | router / emulator CPU share "
        "| burst + reader events/s (rebuilds) | live events/s (driver sent/s, lag) "
        "| live + reader events/s (lag, rebuilds of ms each) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, runs in by_size.items():
        burst = [r.events.burst for r in runs]
        burst_read = [r.events.burst_read for r in runs]
        live = [r.events.live for r in runs]
        live_read = [r.events.live_read for r in runs]
        lines.append(
            f"| {size:,} | {_median(b.per_s for b in burst):,.0f} "
            f"| {_median(b.router_us_per_event for b in burst):.0f} µs "
            f"| {_median(b.router_cpu for b in burst):.0%} / "
            f"{_median(b.emulator_cpu for b in burst):.0%} "
            f"| {_median(b.per_s for b in burst_read):,.0f} "
            f"({_median(b.rebuilds for b in burst_read):.0f}) "
            f"| {_median(v.per_s for v in live):,.0f} "
            f"({_median(v.sent_per_s for v in live):,.0f}, "
            f"{_median(v.lag_s for v in live) * 1000:.0f} ms) "
            f"| {_median(v.per_s for v in live_read):,.0f} "
            f"({_median(v.lag_s for v in live_read) * 1000:.0f} ms, "
            f"{_median(v.rebuilds for v in live_read):.0f} of "
            f"{_median(v.rebuild_ms for v in live_read):.1f} ms) |"
        )
    return lines


def _pieces_table(by_size: dict[int, list[RunResult]]) -> list[str]:
    lines = [
        "| pods | LIST of | body | request (connect, server, transfer) | JSON parse "
        "| map (pod_to_spec) | reconcile | total | router's share (parse+map+reconcile) "
        "| of which cyclic GC |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    phases: tuple[tuple[str, Callable[[RunResult], ListPieces]], ...] = (
        ("initial sync", lambda r: r.sync.pieces),
        ("no-change relist", lambda r: r.relist.pieces),
        ("truth (10% gone)", lambda r: r.truth.pieces),
    )
    for size, runs in by_size.items():
        for phase, pick in phases:
            pieces = [pick(r) for r in runs]
            parts = [
                _median(p.request_s for p in pieces),
                _median(p.parse_s for p in pieces),
                _median(p.map_s for p in pieces),
                _median(p.reconcile_s for p in pieces),
            ]
            cells = " | ".join(f"{part * 1000:.1f} ms" for part in parts)
            lines.append(
                f"| {size:,} | {phase} | {_median(p.body_mib for p in pieces):.2f} MiB "
                f"| {cells} | {sum(parts) * 1000:.1f} ms | {sum(parts[1:]) * 1000:.1f} ms "
                f"| {_median(p.gc_s for p in pieces) * 1000:.1f} ms |"
            )
    return lines


def _goal_lines(by_size: dict[int, list[RunResult]], goals: Goals) -> list[str]:
    lines: list[str] = []
    big = by_size.get(goals.sync_size)
    if big is None:
        lines.append(f"- {goals.sync_size:,}-pod initial sync: not measured (size not run)")
    else:
        sync = _median(r.sync.seconds for r in big)
        lines.append(
            f"- {goals.sync_size:,}-pod initial sync < {goals.sync_s:g} s (no probes): "
            f"{sync:.3f} s, {_verdict(sync < goals.sync_s)}"
        )
    for size, runs in by_size.items():
        relist = _median(r.relist.seconds for r in runs)
        touched = max(r.relist.to_probe + r.relist.changes for r in runs)
        truth = _median(r.truth.seconds for r in runs)
        worst = max(r.truth.seconds for r in runs)
        checked = all(r.truth.blind and r.truth.exact for r in runs)
        lines.append(
            f"- {size:,} pods: no-change relist < {goals.relist_s:g} s with 0 probes: "
            f"{relist:.3f} s, {touched} engine(s) touched, "
            f"{_verdict(relist < goals.relist_s and touched == 0)}; "
            f"time to truth < {goals.truth_s:g} s: median {truth:.3f} s, "
            f"{_verdict(truth < goals.truth_s)}"
            + (f" (worst run {worst:.3f} s: over)" if worst >= goals.truth_s else "")
            + ("" if checked else "; **a blind-period check failed (see every run)**")
        )
    return lines


def _runs_table(by_size: dict[int, list[RunResult]]) -> list[str]:
    lines = [
        "| pods | run | sync s | relist s | relist errors | burst ev/s | router / emulator CPU "
        "| burst+reader ev/s | live ev/s | sent ev/s | lag ms | live+reader ev/s | refused s "
        "| truth s | wait s | LIST→applied s | blind | exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for size, runs in by_size.items():
        for i, r in enumerate(runs, 1):
            e, t = r.events, r.truth
            lines.append(
                f"| {size:,} | {i} | {r.sync.seconds:.3f} | {r.relist.seconds:.3f} "
                f"| {r.relist.error_relists} | {e.burst.per_s:,.0f} "
                f"| {e.burst.router_cpu:.0%} / {e.burst.emulator_cpu:.0%} "
                f"| {e.burst_read.per_s:,.0f} | {e.live.per_s:,.0f} | {e.live.sent_per_s:,.0f} "
                f"| {e.live.lag_s * 1000:.0f} | {e.live_read.per_s:,.0f} | {t.refused_s:.2f} "
                f"| {t.seconds:.3f} | {t.wait_s:.3f} | {t.apply_s:.3f} "
                f"| {t.blind} | {t.exact} |"
            )
    return lines


def profile_section(profile_dir: Path, size: int, top: int = 18) -> list[str]:
    lines = [f"## Profile (one cProfile'd run at {size:,} pods; times inflated by profiling)", ""]
    for phase in ("sync", "relist", "burst", "burst-read", "live", "live-read", "truth"):
        path = profile_dir / f"{phase}.prof"
        if not path.is_file():
            continue
        text = io.StringIO()
        stats = pstats.Stats(str(path), stream=text)
        stats.strip_dirs().sort_stats("tottime").print_stats(top)
        body = text.getvalue()
        start = body.find("   ncalls")
        lines += [
            f"### {phase}: top {top} by own time",
            "",
            "```",
            body[start:].rstrip(),
            "```",
            "",
        ]
    return lines


_READING = (
    "How to read: *time to truth* = back-off wait (API reachable again -> the next LIST "
    "starts: where the retry timer happened to be, between 0 and the current back-off, "
    "so a few runs give a noisy median) + LIST→applied (the code's cost). *request* "
    "includes the emulator (Python) building and sending the body; the router's own cost "
    "is parse + map + reconcile. A *reader* reads `fleet.snapshot` once per loop turn "
    "that changed the fleet, as request traffic does; each read after a write rebuilds "
    "the snapshot.",
)


def render(
    by_size: dict[int, list[RunResult]],
    args: argparse.Namespace,
    elapsed_s: float,
    profile: list[str],
) -> str:
    lines = [
        f"# Discovery benchmark — {datetime.datetime.now().isoformat(timespec='seconds')}",
        "",
        f"Medians of {args.runs} run(s). {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, worker on uvloop; emulator, driver and worker are "
        f"separate processes. {args.events} label changes per events phase. Back-off "
        f"{BACKOFF_INITIAL_S:g} s initial, max {args.backoff_max:g} s (production default: "
        f"30 s). Load average at the start: {args.load_at_start}. Whole run: {elapsed_s:.0f} s. "
        "Method: the docstring of bench/discovery/__init__.py.",
        "",
        *_READING,
        "",
        *_summary_table(by_size),
        "",
        "## Goals",
        "",
        *_goal_lines(by_size, Goals()),
        "",
        "## Watch events (medians)",
        "",
        *_events_table(by_size),
        "",
        "## Where a LIST's time goes (medians; request includes the emulator building the body)",
        "",
        *_pieces_table(by_size),
        "",
        "## Every run",
        "",
        *_runs_table(by_size),
        "",
        *profile,
    ]
    return "\n".join(lines).rstrip() + "\n"
