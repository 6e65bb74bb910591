"""`python -m bench.overhead`: the overhead suite's command line (the method: __init__.py)."""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
from collections.abc import Sequence
from typing import TypeVar

from bench import overhead
from bench.common.harness import BenchError, add_run_arguments, run_benchmark, say
from bench.common.processes import Processes
from bench.overhead.report import render
from bench.overhead.run import Bench, Settings, WorkloadResult
from bench.overhead.targets import ENGINES, TARGETS, WORKLOADS, Target, Workload, baseline_target

DEFAULT_ENGINE_CMD = (
    "{python} -m headcount.sim.engine --host 127.0.0.1 --port {port} --model {model} "
    "--token-delay {token_delay}"
)
DEFAULT_TOKEN_DELAY_S = 1e-6
"""Not 0: at 0 the simulator sends a whole stream in one write, so a router would forward
one read instead of 20 chunks; 1 µs makes every chunk leave in its own write."""
_DESCRIPTION = overhead.__doc__.splitlines()[0] if overhead.__doc__ else None


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=_DESCRIPTION)
    parser.add_argument("--rounds", type=int, help="measurement rounds (default 5; quick 2)")
    parser.add_argument("--duration", type=int, help="seconds per wrk run (default 5; quick 2)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up seconds per target")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (multiple of 2)")
    parser.add_argument(
        "--targets", default=",".join(target.name for target in TARGETS), help="comma list"
    )
    parser.add_argument(
        "--workloads", default=",".join(w.name for w in WORKLOADS), help="comma list"
    )
    parser.add_argument(
        "--require-peers", action="store_true", help="fail instead of skipping a missing peer"
    )
    parser.add_argument(
        "--engine-cmd",
        default=DEFAULT_ENGINE_CMD,
        help="engine command template with {python} {port} {model} {token_delay}",
    )
    parser.add_argument(
        "--token-delay",
        type=float,
        default=DEFAULT_TOKEN_DELAY_S,
        help="engine seconds per token (default 1e-6: one write per streamed chunk)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        action="append",
        default=[],
        help="also measure headcount at git revision REV, side by side (repeatable)",
    )
    parser.add_argument("--start-timeout", type=float, default=30.0, help="seconds per start")
    add_run_arguments(parser)
    return parser.parse_args(argv)


_Named = TypeVar("_Named", Target, Workload)


def _pick(wanted: str, known: Sequence[_Named], what: str) -> tuple[_Named, ...]:
    by_name = {item.name: item for item in known}
    names = [name.strip() for name in wanted.split(",") if name.strip()]
    unknown = [name for name in names if name not in by_name]
    if unknown or not names:
        raise BenchError(f"unknown {what} {unknown}; choose from {', '.join(by_name)}")
    return tuple(by_name[name] for name in names)


def _installed(targets: Sequence[Target], require_peers: bool) -> tuple[Target, ...]:
    kept = []
    for target in targets:
        if target.program is None or target.program.exists():
            kept.append(target)
        elif target.peer and not require_peers:
            say(f"skipping {target.name}: {target.program} not found ({target.install_hint})")
        else:
            raise BenchError(f"{target.name}: {target.program} not found ({target.install_hint})")
    return tuple(kept)


def _settings(args: argparse.Namespace) -> Settings:
    if shutil.which("wrk") is None:
        raise BenchError("wrk not found: run bench/common/peers.sh (or apt-get install wrk)")
    if args.threads < ENGINES or args.threads % ENGINES:
        raise BenchError(f"--threads must be a multiple of {ENGINES} (direct pins one per engine)")
    targets = _installed(_pick(args.targets, TARGETS, "targets"), args.require_peers)
    targets += tuple(baseline_target(rev, args.out) for rev in args.baseline)
    return Settings(
        rounds=args.rounds or (2 if args.quick else 5),
        duration_s=args.duration or (2 if args.quick else 5),
        warmup_s=args.warmup,
        threads=args.threads,
        start_timeout_s=args.start_timeout,
        engine_cmd=args.engine_cmd,
        token_delay_s=args.token_delay,
        targets=targets,
        workloads=_pick(args.workloads, WORKLOADS, "workloads"),
        require_peers=args.require_peers,
        out_dir=args.out,
    )


def _fatal(results: Sequence[WorkloadResult], settings: Settings) -> list[str]:
    """Skips that fail the run: headcount's always, a peer's under --require-peers."""
    by_name = {target.name: target for target in settings.targets}
    return [
        f"{result.workload.name}: {name}"
        for result in results
        for name in result.skipped
        if not by_name[name].peer or settings.require_peers
    ]


def _run(settings: Settings) -> int:
    started = datetime.datetime.now(datetime.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    log_dir = settings.out_dir / f"overhead-{stamp}-logs"
    results = []
    with Processes(log_dir) as procs:
        bench = Bench(procs, settings, log_dir)
        bench.start_engines()
        for workload in settings.workloads:
            results.append(bench.run(workload))
    report = render(results, settings, started.strftime("%Y-%m-%d %H:%M"), log_dir)
    report_path = settings.out_dir / f"overhead-{stamp}.md"
    report_path.write_text(report)
    print(report)
    say(f"report: {report_path}\nlogs: {log_dir}")
    if failed := _fatal(results, settings):
        say(f"not measured: {', '.join(failed)}")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    return run_benchmark(lambda: _run(_settings(args)), args.no_netns)


if __name__ == "__main__":
    sys.exit(main())
