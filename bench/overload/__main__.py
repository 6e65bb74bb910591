"""`python -m bench.overload`: the overload suite's command line (the method: __init__.py)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from collections.abc import Sequence

from bench import overload
from bench.common.harness import BENCH, BenchError, add_run_arguments, run_benchmark, say
from bench.common.peers import peer_versions, runnable_targets
from bench.common.processes import Processes
from bench.overload.fleet import (
    CAPACITY_RPS,
    ENGINES,
    MAX_RUNNING,
    OUTPUT_TOKENS,
    SERVICE_S,
    TOKEN_DELAY_S,
    start_engines,
)
from bench.overload.report import (
    TTFT_SLO_S,
    checks,
    plot,
    render_checks,
    render_points,
    render_table,
    rows,
    summary,
)
from bench.overload.run import Measured, Settings, run_target
from bench.overload.targets import TARGETS
from bench.overload.tenants import TENANTS
from bench.overload.traffic import FULL_FLOOD

PLOT_NAME = "overload-ttft-p90.png"
"""Beside bench/RESULTS.md, which shows it; each run's own copy goes with its report."""
_DESCRIPTION = overload.__doc__.splitlines()[0] if overload.__doc__ else None


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=_DESCRIPTION)
    parser.add_argument(
        "--full",
        action="store_true",
        help="longer windows (90 + 60 s) and load points 0.5,1,2 (~15 min; default: quick, "
        "25 + 20 s and load point 1, ~5 min)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        help="the main run's measured seconds, split 5:4 before and after the sheddable "
        "tenant starts (default 45; full 150)",
    )
    parser.add_argument(
        "--points",
        help=f"comma list of floods (x capacity) measured for the plot besides {FULL_FLOOD:g} "
        "(default 1; full 0.5,1,2; '' for none)",
    )
    parser.add_argument(
        "--drain", type=float, default=35.0, help="seconds a request may outlive its window"
    )
    parser.add_argument("--targets", default=",".join(t.name for t in TARGETS), help="comma list")
    parser.add_argument(
        "--require-peers", action="store_true", help="fail instead of skipping a missing peer"
    )
    add_run_arguments(parser)
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace) -> Settings:
    duration = args.duration if args.duration is not None else (150.0 if args.full else 45.0)
    points = args.points if args.points is not None else ("0.5,1,2" if args.full else "1")
    return Settings(
        targets=runnable_targets(TARGETS, args.targets, args.require_peers),
        warmup_s=10.0 if args.full else 8.0,
        phases_s=(duration * 5 / 9, duration * 4 / 9),
        drain_s=args.drain,
        points=tuple(float(point) for point in points.split(",") if point.strip()),
        point_warmup_s=5.0 if args.full else 3.0,
        point_s=20.0 if args.full else 10.0,
        out_dir=args.out,
        require_peers=args.require_peers,
    )


def _report(
    measured: Sequence[Measured],
    skipped: dict[str, str],
    settings: Settings,
    started: str,
    took_s: float,
) -> str:
    table = [row for each in measured for row in rows(each)]
    lost = {
        each.target.name: sum(1 for run in each.points.values() for o in run.outcomes if o.lost)
        for each in measured
    }
    unsteady = {e.target.name for e in measured if e.main is not None and e.main.steady is False}
    first, second = settings.phases_s
    tenants = "; ".join(
        f"{t.name}: {t.sending.value}"
        + (f" {t.rate_rps:g}/s" if t.rate_rps else f", {t.workers} workers")
        + (f", priority {t.priority}" if t.priority is not None else "")
        + (f", weight {t.weight:g}" if t.weight is not None else "")
        + (f", {t.tokens_per_minute} tokens/min" if t.tokens_per_minute else "")
        + (f", {t.prompt_words}-word prompts" if t.prompt_words > 8 else "")
        + (" (second part only)" if t.late else "")
        for t in TENANTS
    )
    setups = [f"- {each.target.name}: {each.target.setup}" for each in measured]
    notes = [f"- {name} not measured: {reason}" for name, reason in skipped.items()]
    return "\n".join(
        [
            f"# Overload: fairness, priorities and limits under a flood, {started} UTC",
            "",
            f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, "
            f"Python {platform.python_version()}; took {took_s:.0f} s; peers: {peer_versions()}",
            f"- fleet: {ENGINES} sim-engines, --max-running {MAX_RUNNING} --token-delay "
            f"{TOKEN_DELAY_S:g}, {OUTPUT_TOKENS} output tokens a request: service time "
            f"{SERVICE_S:g} s, capacity {CAPACITY_RPS:g} requests/s",
            f"- tenants: {tenants}",
            f"- main run: flood {FULL_FLOOD:g}x capacity, warm-up {settings.warmup_s:g} s (and, "
            "with per-key limits, until capped has had a full minute), window "
            f"{first:g} + {second:g} s, drain "
            f"{settings.drain_s:g} s; TTFT SLO for goodput {TTFT_SLO_S:g} s",
            "- targets:",
            *setups,
            "",
            "## Per target and tenant, the main run",
            "",
            render_table(table),
            "",
            summary(table),
            "",
            '## Checks (issue 18\'s "Done when")',
            "",
            render_checks(checks(table, lost, unsteady)),
            "",
            "## The interactive tenant against offered load",
            "",
            render_points(measured),
            "",
            *notes,
            "",
        ]
    )


def _run(settings: Settings) -> int:
    started = datetime.datetime.now(datetime.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    log_dir = settings.out_dir / f"overload-{stamp}-logs"
    measured: list[Measured] = []
    skipped: dict[str, str] = {}
    began = time.monotonic()
    with Processes(log_dir) as procs:
        engines = start_engines(procs)
        for target in settings.targets:
            try:
                measured.append(run_target(procs, target, engines, settings, log_dir))
            except BenchError as error:
                lines = [line.strip() for line in str(error).splitlines() if line.strip()]
                skipped[target.name] = " ... ".join(dict.fromkeys([lines[0], lines[-1]]))
                say(f"{target.name} not measured: {error}")
    report = _report(
        measured, skipped, settings, started.strftime("%Y-%m-%d %H:%M"), time.monotonic() - began
    )
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    (settings.out_dir / f"overload-{stamp}.md").write_text(report)
    plot(measured, [settings.out_dir / f"overload-{stamp}.png", BENCH / PLOT_NAME])
    print(report)
    say(f"report: {settings.out_dir / f'overload-{stamp}.md'}\nlogs: {log_dir}")
    fatal = [
        name
        for name in skipped
        if name.startswith("headcount") or (name == "vllm-router" and settings.require_peers)
    ]
    return 1 if fatal else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    return run_benchmark(lambda: _run(_settings(args)), args.no_netns)


if __name__ == "__main__":
    sys.exit(main())
