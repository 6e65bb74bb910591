"""`python -m bench.resume`: the resume benchmark's command line (the method: __init__.py)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from collections.abc import Sequence

from bench import resume
from bench.common.harness import (
    BenchError,
    add_run_arguments,
    router_program,
    run_benchmark,
    say,
)
from bench.common.peers import peer_versions, runnable_targets
from bench.common.processes import Processes
from bench.resume.chaos import schedule
from bench.resume.report import checks, render
from bench.resume.run import Measured, Settings, measure
from bench.resume.targets import TARGETS
from bench.resume.traffic import Load
from headcount.compiled import data_plane, stale_compiled
from headcount.sim.cluster import hosts
from headcount.sim.loopback import free_port_on_all

_DESCRIPTION = resume.__doc__.splitlines()[0] if resume.__doc__ else None
ENGINES = 4
DOWN_S = (2.0, 4.0)
QUICK_DOWN_S = (1.5, 3.0)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.resume", description=_DESCRIPTION)
    parser.add_argument("--duration", type=float, help="seconds of load (default 120; quick 20)")
    parser.add_argument("--period", type=float, help="seconds between crashes (default 10; 5)")
    parser.add_argument("--quick", action="store_true", help="20 s, a crash every 5 s")
    parser.add_argument("--seed", type=int, default=1, help="the prompts and the crash schedule")
    parser.add_argument("--concurrency", type=int, default=64, help="client loops")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per answer")
    parser.add_argument("--token-delay", type=float, default=0.02, help="engine s per token")
    parser.add_argument("--targets", default=",".join(t.name for t in TARGETS), help="comma list")
    parser.add_argument(
        "--require-peers", action="store_true", help="fail instead of skipping a missing peer"
    )
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 20.0 if args.quick else 120.0
    if args.period is None:
        args.period = 5.0 if args.quick else 10.0
    if min(args.duration, args.period, args.concurrency, args.max_tokens) <= 0:
        parser.error("--duration, --period, --concurrency and --max-tokens must be positive")
    return args


def _compiled() -> str:
    """The form of the data plane measured, and any compiled module older than its source
    (it would run code other than the source's)."""
    if data_plane() == "python":
        return "pure Python"
    stale = stale_compiled()
    return "compiled" + (
        f", **{len(stale)} modules older than their source**: {', '.join(stale[:8])}"
        if stale
        else ", no module older than its source"
    )


def _setup(args: argparse.Namespace, settings: Settings, took_s: float) -> list[str]:
    _, source = router_program(None, args.out)
    kills = settings.kills
    stream_s = args.max_tokens * args.token_delay
    return [
        f"- headcount: {source}; {_compiled()}",
        f"- fleet: {ENGINES} sim-engines as processes on {settings.hosts[0]}-"
        f"{settings.hosts[-1].rsplit('.', 1)[1]}:{settings.port}, --token-delay "
        f"{args.token_delay:g}; started afresh for each router. An ordinary gap between two "
        f"events is one token delay ({args.token_delay * 1000:g} ms); a seam is the "
        "detection, the continuation's request and its first token",
        f"- load: {args.concurrency} client loops for {args.duration:g} s, streamed "
        f"`/v1/chat/completions`, max_tokens {args.max_tokens} (≈{stream_s:g} s a stream), "
        f"a prompt and an `x-request-id` per request; seed {args.seed}",
        f"- crashes: {len(kills)}, SIGKILL every {args.period:g} s from {kills[0].at:g} s, "
        f"engines round robin from engine {kills[0].engine}, each restarted on its address "
        f"after {min(k.down_s for k in kills):g}-{max(k.down_s for k in kills):g} s"
        if kills
        else "- crashes: none (the run is shorter than half a period)",
        f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
        f"{platform.python_version()}; peers: {peer_versions()}; took {took_s:.0f} s; "
        f"logs: {settings.log_dir}",
    ]


def _run(args: argparse.Namespace) -> int:
    targets = runnable_targets(TARGETS, args.targets, args.require_peers)
    started = datetime.datetime.now(datetime.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"resume-{stamp}-logs"
    addresses = hosts("127.0.2", ENGINES)
    settings = Settings(
        duration_s=args.duration,
        kills=schedule(
            args.seed, args.duration, args.period, QUICK_DOWN_S if args.quick else DOWN_S, ENGINES
        ),
        load=Load(concurrency=args.concurrency, max_tokens=args.max_tokens, seed=args.seed),
        token_delay=args.token_delay,
        hosts=addresses,
        port=free_port_on_all(addresses),
        log_dir=log_dir,
    )
    measured: list[Measured] = []
    wanted = {name.strip() for name in args.targets.split(",")}
    skipped = {t.name: "not installed" for t in TARGETS if t.name in wanted and t not in targets}
    with Processes(log_dir) as procs:
        for target in targets:
            try:
                measured.append(measure(target, procs, settings))
            except BenchError as error:
                say(f"{target.name} not measured: {error}")
                skipped[target.name] = str(error).splitlines()[0][:200]
    took = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
    verdict = checks(measured)
    report = render(
        measured, skipped, verdict, _setup(args, settings, took), started.strftime("%Y-%m-%d %H:%M")
    )
    path = args.out / f"resume-{stamp}.md"
    path.write_text(report)
    print(report)
    failed = [check.name for check in verdict if not check.ok]
    if args.require_peers:
        failed += [f"{name} measured" for name in skipped]
    for name in failed:
        say(f"check failed: {name}")
    say(f"report: {path}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    return run_benchmark(lambda: _run(args), args.no_netns)


if __name__ == "__main__":
    sys.exit(main())
