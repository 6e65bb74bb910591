"""`python -m bench.discovery`: the discovery suite's command line (the method: __init__.py)."""

from __future__ import annotations

import argparse
import datetime
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import uvloop

from bench import discovery
from bench.common.harness import OUT, BenchError
from bench.common.processes import Processes
from bench.discovery.measure import EVENTS, Plan, RunResult, measure_size
from bench.discovery.report import profile_section, render
from bench.discovery.scenario import BACKOFF_MAX_S

_DESCRIPTION = discovery.__doc__.splitlines()[0] if discovery.__doc__ else None


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.discovery", description=_DESCRIPTION)
    parser.add_argument("--sizes", default="100,1000,5000", help="pod counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs per size (median reported)")
    parser.add_argument("--events", type=int, default=EVENTS, help="label changes per run")
    parser.add_argument(
        "--quick", action="store_true", help="sizes 100,1000, one run, 500 events: a smoke run"
    )
    parser.add_argument(
        "--profile", action="store_true", help="add one cProfile'd run at the largest size"
    )
    parser.add_argument(
        "--backoff-max",
        type=float,
        default=BACKOFF_MAX_S,
        help="the reflector's back-off ceiling in seconds (production: 30)",
    )
    parser.add_argument("--seed", type=int, default=1, help="for the pods deleted and S")
    parser.add_argument("--out", type=Path, default=OUT, help="report directory")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.runs, args.events = "100,1000", 1, 500
    try:
        args.size_list = sorted({int(size) for size in args.sizes.split(",") if size.strip()})
    except ValueError:
        parser.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if not args.size_list or min(args.size_list) < 10 or args.runs < 1 or args.events < 1:
        parser.error("need sizes >= 10, --runs >= 1, --events >= 1")
    return args


async def _bench(
    args: argparse.Namespace, log_dir: Path
) -> tuple[dict[int, list[RunResult]], list[str]]:
    plan = Plan(
        runs=args.runs,
        events=args.events,
        backoff_max=args.backoff_max,
        log_dir=log_dir,
        profile_size=max(args.size_list) if args.profile else None,
    )
    rng = random.Random(args.seed)
    by_size: dict[int, list[RunResult]] = {}
    with Processes(log_dir) as procs:
        for size in args.size_list:
            print(f"{size} pods:", flush=True)
            by_size[size] = await measure_size(procs, plan, size, rng)
    if plan.profile_size is None:
        return by_size, []
    return by_size, profile_section(plan.profile_dir(plan.profile_size), plan.profile_size)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    args.load_at_start = " ".join(f"{load:.2f}" for load in os.getloadavg())
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"discovery-{stamp}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        by_size, profile = uvloop.run(_bench(args, log_dir))
    except BenchError as error:
        print(f"discovery bench failed: {error}", file=sys.stderr)
        return 1
    report = render(by_size, args, time.monotonic() - started, profile)
    report_path = args.out / f"discovery-{stamp}.md"
    report_path.write_text(report)
    print()
    print(report)
    print(f"report: {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
