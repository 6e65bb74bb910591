"""`python -m bench.routing`: the routing suite's command line (the method: __init__.py)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from collections.abc import Sequence

from bench import routing
from bench.common.harness import BENCH, BenchError, add_run_arguments, run_benchmark, say
from bench.common.peers import runnable_targets
from bench.common.processes import Processes
from bench.routing.bounds_report import Analysed, analyse, render_bounds
from bench.routing.fleet import (
    ENGINES,
    KV_BLOCKS,
    PREFILL_TOKENS_PER_S,
    TOKEN_DELAY_S,
    start_engines,
)
from bench.routing.report import (
    Recovery,
    Row,
    highest_load_summary,
    lag_warnings,
    plot,
    render_cells,
    render_recoveries,
    render_table,
)
from bench.routing.run import FAULTS, RunKey, Settings, run_target
from bench.routing.targets import TARGETS
from bench.routing.trace import RunTrace
from bench.routing.workload import DEFAULT_WORKLOADS, WORKLOADS, Workload

PLOT_NAME = "routing-ttft-p90.png"
"""Beside bench/RESULTS.md, which shows it; each run's own copy goes with its report."""
_DESCRIPTION = routing.__doc__.splitlines()[0] if routing.__doc__ else None


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.routing", description=_DESCRIPTION)
    parser.add_argument(
        "--quick", action="store_true", help="a few-minute smoke run: pressure, short windows"
    )
    parser.add_argument(
        "--workloads",
        help=f"comma list of {', '.join(WORKLOADS)} (default {','.join(DEFAULT_WORKLOADS)}; "
        "quick pressure)",
    )
    parser.add_argument(
        "--rates", help="comma list of request rates, req/s (default: each workload's own)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        help="unmeasured requests sent first in each run (default 200; quick 120)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        help="measured requests per run, i.e. per seed (default 400; quick 240)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        help="runs per workload and load, each its own seed (default 3; quick 1)",
    )
    parser.add_argument(
        "--drain", type=float, default=15.0, help="seconds a request may outlive the last send"
    )
    parser.add_argument("--targets", default=",".join(t.name for t in TARGETS), help="comma list")
    parser.add_argument(
        "--require-peers", action="store_true", help="fail instead of skipping a missing peer"
    )
    add_run_arguments(parser)
    parser.add_argument(
        "--fault",
        choices=sorted(FAULTS),
        help="inject this KV-event stream fault into one engine a third into each window "
        "and report TTFT's recovery (use more --requests, e.g. 36 s' worth)",
    )
    return parser.parse_args(argv)


def _workloads(names: str) -> tuple[Workload, ...]:
    unknown = [name for name in names.split(",") if name not in WORKLOADS]
    if unknown:
        raise BenchError(f"unknown workload {unknown[0]!r}: choose among {', '.join(WORKLOADS)}")
    return tuple(WORKLOADS[name] for name in names.split(","))


def _settings(args: argparse.Namespace) -> Settings:
    targets = runnable_targets(TARGETS, args.targets, args.require_peers)
    names = args.workloads or ("pressure" if args.quick else ",".join(DEFAULT_WORKLOADS))
    return Settings(
        workloads=_workloads(names),
        rates=tuple(float(rate) for rate in args.rates.split(",")) if args.rates else None,
        warmup_requests=args.warmup if args.warmup is not None else (120 if args.quick else 200),
        requests=args.requests if args.requests is not None else (240 if args.quick else 400),
        seeds=args.seeds if args.seeds is not None else (1 if args.quick else 3),
        drain_s=args.drain,
        targets=targets,
        require_peers=args.require_peers,
        out_dir=args.out,
        fault=args.fault,
    )


def _report(
    rows: Sequence[Row],
    analysed: Sequence[Analysed],
    recoveries: Sequence[Recovery],
    skipped: dict[str, str],
    settings: Settings,
    started: str,
    took_s: float,
) -> str:
    notes = [f"- {name} not measured: {reason}" for name, reason in skipped.items()]
    return "\n".join(
        [
            f"# Routing quality, {started} UTC",
            "",
            f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, "
            f"Python {platform.python_version()}; took {took_s:.0f} s",
            f"- fleet: {ENGINES} sim-engines, --kv-blocks {KV_BLOCKS} --block-size 16 "
            f"--prefill-tokens-per-s {PREFILL_TOKENS_PER_S} --token-delay {TOKEN_DELAY_S}",
            f"- per run: caches reset, warm-up {settings.warmup_requests} requests, "
            f"{settings.requests} requests measured, drain {settings.drain_s:g} s; Poisson "
            f"arrivals, open loop; {settings.seeds} seed(s) per workload and load, ± is the 95 % "
            "interval over seeds (Student's t on the per-seed values)",
            "",
            *notes,
            "",
            *(
                _workload_section(workload, rows, analysed, settings)
                for workload in settings.workloads
            ),
            render_recoveries(recoveries),
            "",
        ]
    )


def _seeds(workload: Workload, settings: Settings) -> str:
    return ", ".join(str(workload.shape.seed + offset) for offset in range(settings.seeds))


def _workload_section(
    workload: Workload, rows: Sequence[Row], analysed: Sequence[Analysed], settings: Settings
) -> str:
    own = [row for row in rows if row.workload == workload.name]
    return "\n".join(
        [
            f"## Workload `{workload.name}`",
            "",
            f"{workload.shape.describe()}; seeds {_seeds(workload, settings)}",
            "",
            render_cells(own),
            "",
            *lag_warnings(own),
            "",
            render_bounds(workload.name, analysed),
            "",
            highest_load_summary(own),
            "",
            f"### `{workload.name}` per seed",
            "",
            render_table(own),
            "",
        ]
    )


def _run(settings: Settings) -> int:
    started = datetime.datetime.now(datetime.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    log_dir = settings.out_dir / f"routing-{stamp}-logs"
    rows: list[Row] = []
    traces: list[tuple[str, RunKey, RunTrace]] = []
    recoveries: list[Recovery] = []
    skipped: dict[str, str] = {}
    began = time.monotonic()
    with Processes(log_dir) as procs:
        engines = start_engines(procs)
        for target in settings.targets:
            try:
                for key, row, trace in run_target(procs, target, engines, settings, recoveries):
                    rows.append(row)
                    traces.append((target.name, key, trace))
            except BenchError as error:
                skipped[target.name] = str(error).splitlines()[0]
                say(f"{target.name} not measured: {error}")
    say("replaying the traces through the cache model and searching the bounds")
    report = _report(
        rows,
        analyse(traces),
        recoveries,
        skipped,
        settings,
        started.strftime("%Y-%m-%d %H:%M"),
        time.monotonic() - began,
    )
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    (settings.out_dir / f"routing-{stamp}.md").write_text(report)
    plot(rows, [settings.out_dir / f"routing-{stamp}.png", BENCH / PLOT_NAME])
    print(report)
    say(f"report: {settings.out_dir / f'routing-{stamp}.md'}\nlogs: {log_dir}")
    by_name = {target.name: target for target in settings.targets}
    fatal = [
        name
        for name in skipped
        if name.startswith("headcount") or (by_name[name].peer and settings.require_peers)
    ]
    return 1 if fatal else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    return run_benchmark(lambda: _run(_settings(args)), args.no_netns)


if __name__ == "__main__":
    sys.exit(main())
