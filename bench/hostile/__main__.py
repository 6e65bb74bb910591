"""`python -m bench.hostile`: the hostile suite's command line (the method: __init__.py)."""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Sequence

from bench import hostile
from bench.common.harness import (
    BenchError,
    add_run_arguments,
    router_program,
    run_benchmark,
    say,
)
from bench.common.processes import Processes
from bench.hostile.report import Phase, PhaseRun, Scale, render
from bench.hostile.run import PHASES, QUICK, ROUTER_TIMINGS, Bench

_DESCRIPTION = hostile.__doc__.splitlines()[0] if hostile.__doc__ else None


def _pick_phases(wanted: str) -> tuple[Phase, ...]:
    tokens = [token.strip() for token in wanted.split(",") if token.strip()]
    chosen = [
        phase
        for phase in PHASES
        if phase.name == "quiet"
        or any(phase.name == t or phase.name.startswith(t + "-") for t in tokens)
    ]
    unknown = [
        t for t in tokens if not any(p.name == t or p.name.startswith(t + "-") for p in PHASES)
    ]
    if unknown:
        names = ", ".join(p.name for p in PHASES)
        raise BenchError(f"unknown phases {unknown}; choose from {names} (or a letter)")
    return tuple(chosen)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=_DESCRIPTION)
    parser.add_argument("--quick", action="store_true", help="short phases: a smoke run")
    parser.add_argument(
        "--phases",
        default=",".join(p.name for p in PHASES[1:]),
        help="comma list of phases or their letters (a,f,g-hung); quiet always runs",
    )
    parser.add_argument("--attack-seconds", type=float, help="override the attack length")
    parser.add_argument(
        "--rss-limit", type=float, default=8192, help="MiB: stop an attack past this router RSS"
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="run the router as it was at git revision REV (for before/after numbers)",
    )
    add_run_arguments(parser)
    return parser.parse_args(argv)


def _run(args: argparse.Namespace) -> int:
    scale = QUICK if args.quick else Scale()
    if args.attack_seconds:
        scale = Scale(**{**scale.__dict__, "attack_s": args.attack_seconds})
    phases = _pick_phases(args.phases)
    started = datetime.datetime.now(datetime.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"hostile-{stamp}-logs"
    runs: list[PhaseRun] = []
    program, source = router_program(args.baseline, args.out)
    with Processes(log_dir) as procs:
        bench = Bench(procs, scale, log_dir, args.rss_limit, program)
        bench.start_engines()
        for phase in phases:
            say(f"phase {phase.name}: {phase.title}")
            runs.append(bench.run(phase))
    stamp_text = started.strftime("%Y-%m-%d %H:%M")
    report = render(runs, scale, stamp_text, log_dir, source, ROUTER_TIMINGS.probe_interval)
    path = args.out / f"hostile-{stamp}.md"
    path.write_text(report)
    print(report)
    say(f"report: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    return run_benchmark(lambda: _run(args), args.no_netns)


if __name__ == "__main__":
    sys.exit(main())
