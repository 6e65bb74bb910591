"""`python -m bench.soak`: the soak's command line (the method: __init__.py)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

import uvloop

from bench import soak
from bench.common.harness import add_run_arguments, router_program, run_benchmark
from bench.common.processes import Processes
from bench.soak.report import Result, render
from bench.soak.run import ENGINES, ROUTER_TIMINGS, TOKEN_DELAY_S, Soak
from bench.soak.traffic import Mix

_DESCRIPTION = soak.__doc__.splitlines()[0] if soak.__doc__ else None


def _setup(args: argparse.Namespace, result: Result, log_dir: Path) -> list[str]:
    """The report's first lines: what ran, and where."""
    return [
        f"- headcount: {args.source}",
        f"- {args.duration:g} s of chaos (ran {result.elapsed_s:.0f} s with healing), seed "
        f"{args.seed}; {ENGINES} engines (token delay {TOKEN_DELAY_S * 1000:g} ms), router "
        f"`--discovery k8s-pods {_timings()}`",
        f"- traffic: {args.rate:g} requests/s (Poisson), half streaming, 10% abandoned by the "
        f"client; client timeout {Mix().timeout_s:g} s",
        f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
        f"{platform.python_version()}; logs: {log_dir}",
    ]


def _timings() -> str:
    """The timings set on the router, as its flags spell them."""
    return " ".join(
        f"--{each.name.replace('_', '-')}={value:g}"
        for each in dataclasses.fields(ROUTER_TIMINGS)
        if (value := getattr(ROUTER_TIMINGS, each.name)) is not None
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=_DESCRIPTION)
    parser.add_argument("--duration", type=float, help="seconds of chaos (default 600; quick 60)")
    parser.add_argument("--quick", action="store_true", help="60 s, faults more often")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of traffic first")
    parser.add_argument("--seed", type=int, default=1, help="the chaos schedule and traffic")
    parser.add_argument(
        "--baseline", metavar="REV", help="run the router as it was at git revision REV"
    )
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 60.0 if args.quick else 600.0
    if args.duration <= 0 or args.rate <= 0:
        parser.error("--duration and --rate must be positive")
    return args


def _run(args: argparse.Namespace) -> int:
    args.program, args.source = router_program(args.baseline, args.out)
    started = datetime.datetime.now(datetime.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"soak-{stamp}-logs"
    with Processes(log_dir) as procs:
        soak = Soak(args, procs, log_dir)
        result = uvloop.run(soak.run())
    (log_dir / "samples.json").write_text(json.dumps(soak.samples))
    report = render(result, _setup(args, result, log_dir), started.strftime("%Y-%m-%d %H:%M"))
    path = args.out / f"soak-{stamp}.md"
    path.write_text(report)
    print(report)
    failed = [check.name for check in result.checks if not check.ok]
    for name in failed:
        print(f"check failed: {name}", file=sys.stderr)
    print(f"report: {path}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    return run_benchmark(lambda: _run(args), args.no_netns)


if __name__ == "__main__":
    sys.exit(main())
