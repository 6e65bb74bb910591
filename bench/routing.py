"""Measure routing quality: what each router's choices do to time to first token on a caching fleet.

Method (the numbers are only as good as this):

- Private network namespace, loopback only (as bench/overhead.py).
- Fleet: 4 `headcount sim-engine` processes with a prefix cache
  (`--kv-blocks 720`, block size 16: 11,520 tokens, about 5.6 of the 16 tenants'
  ~2,000-token system prompts, i.e. a quarter of them plus the room running
  requests need), prefill 4,000 uncached tokens/s shared first come first
  served, 20 ms per output token. That is an 8B model on an H100 (16,000 tok/s,
  10 ms/token) slowed 4x in prefill and 2x in decode, so the fleet saturates at
  request rates 2 shared cores can generate and serve without the CPU becoming
  the bottleneck. KV events are published with topic "" (vLLM's default; what
  vllm-router's kv_aware needs); the same engines serve every target. Each
  engine has its own loopback address (127.0.0.11 on) and all share one pair
  of KV-event ports, as pods do, so a router finds every publisher with one port.
- Workload (`_workload.py`, seeded): 16 tenants, each a ~2,000-token system
  prompt; short unique questions; 30 % of requests continue a multi-turn chat
  whose history grows; 24 output tokens, streamed. Poisson arrivals, open loop
  (`_loadgen.py`), at each rate of `--rates`; the generator's own lag (actual
  minus scheduled send) is reported as p99.
- Per target and rate: every engine's prefix cache is reset
  (`POST /sim/reset_prefix_cache` once they are idle), then `--warmup` requests'
  worth of traffic (not measured: the caches fill; counted in requests, not
  seconds, so every load starts the window about as warm), then `--duration` seconds measured.
  Requests still open `--drain` seconds after the last send count as failed.
- Targets: headcount `round-robin`, `least-loaded`, `prefix`, `kv-aware`
  (`--tokenizer builtin`, the simulator's, and the engines' KV events) and
  `kv-aware /tokenize` (no tokenizer: each request's ids from an engine's
  `POST /tokenize`); vllm-router
  `cache_aware`, `kv_aware` (static `--kv-event-source`/`--kv-event-replay-source`
  per engine, `--kv-event-model`), `round_robin`; sglang-router `cache_aware`,
  `round_robin`; and `oracle` (`_oracle.py`): asks every engine's
  `POST /sim/kv-cache/predict` per request and picks the lowest predicted TTFT.
  Peers with default settings otherwise.
- Reported: TTFT p50/p90/p99 (first content chunk), end-to-end p50/p90, output
  tokens/s over the measured window, cache hit rate from the engines' own
  `vllm:prefix_cache_hits_total / queries_total` deltas over the measured window,
  failed requests, router CPU (utime+stime of its process tree) per request sent,
  each engine's share of the measured requests, generator lag p99.

Usage: `.venv/bin/python bench/routing.py [--quick] [--rates 3,7,11] [--duration S]
[--warmup N] [--targets a,b] [--require-peers] [--fault restart|gap]`; `make bench-routing`.
With `--fault`, one engine's event stream breaks a third of the way into each measured
window and the report adds TTFT p90 over time and when it returned to its pre-fault level.
Exit 0 when measured, 1 if a headcount target could not be measured, 2 on setup errors. The
report is printed and written to `bench/out/routing-<timestamp>.md` with the plot
beside it and in `bench/routing-ttft-p90.png`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import json
import os
import platform
import re
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from _harness import (
    BenchError,
    HttpAnswer,
    Proc,
    Processes,
    free_port,
    http_call,
    run_benchmark,
    tree_cpu_seconds,
    wait_until,
)
from _loadgen import Outcome, run_open_loop
from _routing_report import (
    Recovery,
    Row,
    highest_load_summary,
    plot,
    recovery,
    render_recoveries,
    render_table,
    summarise,
)
from _workload import WorkloadShape, arrivals

from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import RouterFlags, serve_command
from headcount.sim.loopback import free_port_on_all

__all__ = ["TARGETS", "main"]

BENCH = Path(__file__).resolve().parent
PEERS_BIN = BENCH / ".venv-peers" / "bin"
VENV_BIN = Path(sys.executable).parent
MODEL = "sim-model"
ENGINES = 4
KV_BLOCKS = 720
PREFILL_TOKENS_PER_S = 4000
TOKEN_DELAY_S = 0.02
PLOT_NAME = "routing-ttft-p90.png"
_COUNTER = re.compile(rb"^vllm:prefix_cache_(hits|queries)_total\{[^}]*\} ([0-9.e+]+)$", re.M)


@dataclass(frozen=True)
class Engine:
    """One sim-engine on its own loopback address; all share the KV-event ports, as pods do."""

    proc: Proc
    host: str
    port: int
    events_port: int
    replay_port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def call(self, method: str, path: str, body: bytes | None = None) -> HttpAnswer | None:
        return http_call(self.port, method, path, body, host=self.host)


@dataclass(frozen=True)
class Target:
    """A router to measure: `command` starts it given its port, metrics port and the engines."""

    name: str
    program: Path
    command: Callable[[int, int, Sequence[Engine]], list[str]]
    peer: bool = False


def _headcount(
    policy: RoutingName, tokenizer: str | None, port: int, _: int, engines: Sequence[Engine]
) -> list[str]:
    kv_aware = policy is RoutingName.KV_AWARE
    flags = RouterFlags(
        discovery=DiscoveryMode.STATIC,
        backends=tuple(engine.url for engine in engines),
        routing=policy,
        tokenizer=tokenizer,
        kv_events_port=engines[0].events_port if kv_aware else None,
        kv_events_replay_port=engines[0].replay_port if kv_aware else None,
    )
    return serve_command(flags, host="127.0.0.1", port=port, program=(str(VENV_BIN / "headcount"),))


def _vllm_router(policy: str, port: int, metrics: int, engines: Sequence[Engine]) -> list[str]:
    argv = [str(PEERS_BIN / "vllm-router"), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--worker-urls", *(engine.url for engine in engines), "--policy", policy]
    argv += ["--prometheus-port", str(metrics), "--worker-startup-timeout-secs", "30"]
    argv += ["--log-level", "warning"]
    if policy == "kv_aware":
        for engine in engines:
            argv += ["--kv-event-source", f"{engine.url}=tcp://{engine.host}:{engine.events_port}"]
            argv += [
                "--kv-event-replay-source",
                f"{engine.url}=tcp://{engine.host}:{engine.replay_port}",
            ]
        argv += ["--kv-event-model", MODEL]
    return argv


def _sglang_router(policy: str, port: int, metrics: int, engines: Sequence[Engine]) -> list[str]:
    argv = [str(PEERS_BIN / "python"), "-m", "sglang_router.launch_router"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--policy", policy]
    argv += ["--worker-urls", *(engine.url for engine in engines)]
    return [*argv, "--prometheus-port", str(metrics), "--log-level", "warn"]


def _oracle(port: int, _: int, engines: Sequence[Engine]) -> list[str]:
    urls = ",".join(engine.url for engine in engines)
    return [sys.executable, str(BENCH / "_oracle.py"), "--port", str(port), "--engines", urls]


def _hc(policy: RoutingName, tokenizer: str | None = None, suffix: str = "") -> Target:
    return Target(
        f"headcount {policy.value}{suffix}",
        VENV_BIN / "headcount",
        functools.partial(_headcount, policy, tokenizer),
    )


def _peer(name: str, program: Path, command: Callable[..., list[str]], policy: str) -> Target:
    return Target(f"{name} {policy}", program, functools.partial(command, policy), peer=True)


TARGETS: tuple[Target, ...] = (
    _hc(RoutingName.ROUND_ROBIN),
    _hc(RoutingName.LEAST_LOADED),
    _hc(RoutingName.PREFIX),
    _hc(RoutingName.KV_AWARE, "builtin"),
    _hc(RoutingName.KV_AWARE, None, " /tokenize"),
    _peer("vllm-router", PEERS_BIN / "vllm-router", _vllm_router, "cache_aware"),
    _peer("vllm-router", PEERS_BIN / "vllm-router", _vllm_router, "kv_aware"),
    _peer("vllm-router", PEERS_BIN / "vllm-router", _vllm_router, "round_robin"),
    _peer("sglang-router", PEERS_BIN / "sglang-router", _sglang_router, "cache_aware"),
    _peer("sglang-router", PEERS_BIN / "sglang-router", _sglang_router, "round_robin"),
    Target("oracle", Path(sys.executable), _oracle),
)


@dataclass(frozen=True)
class Settings:
    rates: tuple[float, ...]
    warmup_requests: int
    duration_s: float
    drain_s: float
    targets: tuple[Target, ...]
    require_peers: bool
    out_dir: Path
    shape: WorkloadShape
    fault: str | None = None
    """Inject this event-stream fault (`FAULTS`) into the first engine a third of the way
    into each measured window, and report TTFT's recovery."""


FAULTS: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "restart": ({"restart": True}, {}),
    "gap": ({"drop": 3, "replay": False}, {"replay": True}),
}
"""Per fault, the `/sim/kv-events` body that injects it and the one that undoes it after
the run: `restart` is a new engine process (empty cache, sequence from 0), `gap` loses
three batches and leaves replay unanswered, so no subscriber can fill the gap."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- the fleet ------------------------------------------------------------------


def start_engines(procs: Processes) -> list[Engine]:
    engines = []
    addresses = [f"127.0.0.{10 + index}" for index in range(1, ENGINES + 1)]
    events, replay = free_port_on_all(addresses), free_port_on_all(addresses)
    for index, host in enumerate(addresses, start=1):
        port = free_port_on_all([host])
        argv = [sys.executable, "-m", "headcount.sim.engine", "--host", host]
        argv += ["--port", str(port), "--model", MODEL, "--token-delay", str(TOKEN_DELAY_S)]
        argv += ["--kv-blocks", str(KV_BLOCKS), "--prefill-tokens-per-s", str(PREFILL_TOKENS_PER_S)]
        argv += ["--kv-events-port", str(events), "--kv-events-replay-port", str(replay)]
        argv += ["--kv-events-topic", "", "--name", f"engine-{index}"]
        proc = procs.start(f"engine-{index}", argv, port=port)
        engines.append(Engine(proc, host, port, events, replay))
    for engine in engines:
        wait_until(
            lambda e=engine: e.call("GET", "/health") is not None,
            30,
            f"{engine.proc.name} to answer",
            engine.proc,
        )
    return engines


def _idle(engine: Engine) -> bool:
    answer = engine.call("GET", "/sim/kv-cache")
    if answer is None or not answer.ok:
        return False
    view = json.loads(answer.body)
    return view.get("running") == 0 and not view.get("waiting")


def reset_caches(engines: Sequence[Engine]) -> None:
    """Wait until every engine is idle, then empty its prefix cache."""
    for engine in engines:
        wait_until(functools.partial(_idle, engine), 60, f"{engine.proc.name} to go idle")
        wait_until(
            lambda e=engine: (
                (a := e.call("POST", "/sim/reset_prefix_cache", b"{}")) is not None and a.ok
            ),
            30,
            f"{engine.proc.name} to reset its prefix cache",
        )


def counters(engines: Sequence[Engine]) -> tuple[float, float]:
    """Summed (hits, queries) prefix-cache tokens of the fleet, from each engine's /metrics."""
    hits = queries = 0.0
    for engine in engines:
        answer = engine.call("GET", "/metrics")
        if answer is None or not answer.ok:
            raise BenchError(f"{engine.proc.name}: /metrics did not answer")
        for kind, value in _COUNTER.findall(answer.body):
            if kind == b"hits":
                hits += float(value)
            else:
                queries += float(value)
    return hits, queries


def served(engines: Sequence[Engine]) -> list[int]:
    counts = []
    for engine in engines:
        answer = engine.call("GET", "/sim/stats")
        counts.append(int(json.loads(answer.body)["served"]) if answer and answer.ok else 0)
    return counts


# --- one target -----------------------------------------------------------------


def _probe_ok(port: int, shape: WorkloadShape) -> bool:
    body = arrivals(shape, MODEL, 50.0, 0.05)[0].body
    answer = http_call(port, "POST", "/v1/chat/completions", body, timeout_s=10)
    return answer is not None and answer.ok and b"[DONE]" in answer.body


def start_router(
    procs: Processes, target: Target, engines: Sequence[Engine], shape: WorkloadShape
) -> tuple[Proc, int]:
    port, metrics = free_port(), free_port()
    log_name = re.sub(r"[^A-Za-z0-9_.-]+", "-", target.name)
    proc = procs.start(log_name, target.command(port, metrics, engines), port)
    wait_until(lambda: _probe_ok(port, shape), 60, f"{target.name} to answer a chat", proc)
    if target.name.startswith("headcount"):
        # Until every engine is ready, headcount routes over the ones it has probed.
        wait_until(
            lambda: (
                (a := http_call(port, "GET", "/engines")) is not None
                and a.body.count(b'"ready"') >= ENGINES
            ),
            30,
            f"{target.name} to list {ENGINES} ready engines",
            proc,
        )
    return proc, port


def measure(
    target: Target,
    rate: float,
    router: Proc,
    port: int,
    engines: Sequence[Engine],
    settings: Settings,
    recoveries: list[Recovery],
) -> Row:
    """One measured run; with `settings.fault`, its recovery is appended to `recoveries`."""
    reset_caches(engines)
    warmup_s = settings.warmup_requests / rate
    schedule = arrivals(settings.shape, MODEL, rate, warmup_s + settings.duration_s)
    marks: dict[str, object] = {}

    async def at_window_start() -> None:
        marks["counters"] = counters(engines)
        marks["cpu"] = tree_cpu_seconds(router.pid)
        marks["served"] = served(engines)

    hooks: list[tuple[float, Callable[[], Awaitable[None]]]] = [(warmup_s, at_window_start)]
    fault_s = warmup_s + settings.duration_s / 3
    if settings.fault is not None:
        inject, undo = (json.dumps(body).encode() for body in FAULTS[settings.fault])

        async def at_fault() -> None:
            if engines[0].call("POST", "/sim/kv-events", inject) is None:
                raise BenchError(f"{engines[0].proc.name}: the fault was not injected")

        hooks.append((fault_s, at_fault))
    outcomes: list[Outcome] = asyncio.run(
        run_open_loop(f"http://127.0.0.1:{port}", schedule, settings.drain_s, hooks)
    )
    if settings.fault is not None:
        engines[0].call("POST", "/sim/kv-events", undo)
        recoveries.append(
            recovery(
                target.name,
                rate,
                settings.fault,
                outcomes,
                (warmup_s, fault_s, warmup_s + settings.duration_s),
            )
        )
    if not router.alive():
        raise BenchError(f"{router.name} exited:\n{router.log_tail()}")
    hits, queries = counters(engines)
    hits0, queries0 = marks.get("counters", (0.0, 0.0))  # type: ignore[misc]
    cpu = tree_cpu_seconds(router.pid) - float(marks.get("cpu", 0.0))  # type: ignore[arg-type]
    split_now = served(engines)
    split_then = marks.get("served", [0] * ENGINES)
    deltas = [a - b for a, b in zip(split_now, split_then, strict=True)]  # type: ignore[call-overload]
    split = "/".join(f"{100 * d / sum(deltas):.0f}" for d in deltas) if sum(deltas) else "—"
    measured = [o for o in outcomes if o.arrival.at_s >= warmup_s]
    hit_rate = (hits - hits0) / (queries - queries0) if queries > queries0 else None
    return summarise(target.name, rate, measured, settings.duration_s, hit_rate, cpu, split)


def run_target(
    procs: Processes,
    target: Target,
    engines: Sequence[Engine],
    settings: Settings,
    recoveries: list[Recovery],
) -> list[Row]:
    router, port = start_router(procs, target, engines, settings.shape)
    rows = []
    try:
        for rate in settings.rates:
            row = measure(target, rate, router, port, engines, settings, recoveries)
            _say(
                f"{target.name:<26} {rate:5g} req/s: TTFT p50 {row.ttft_p50} p90 {row.ttft_p90} "
                f"hit {row.hit_rate} failed {row.failed}/{row.sent} lag p99 {row.lag_p99_ms:.1f} ms"
            )
            rows.append(row)
    finally:
        procs.stop(router)
    return rows


# --- command line ---------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a ~2-minute smoke run: one rate, short windows"
    )
    parser.add_argument(
        "--rates", help="comma list of request rates, req/s (default 3,7,11; quick 7)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        help="unmeasured requests sent first in each run (default 60; quick 20)",
    )
    parser.add_argument(
        "--duration", type=float, help="measured seconds per run (default 14; quick 6)"
    )
    parser.add_argument(
        "--drain", type=float, default=15.0, help="seconds a request may outlive the last send"
    )
    parser.add_argument("--targets", default=",".join(t.name for t in TARGETS), help="comma list")
    parser.add_argument(
        "--require-peers", action="store_true", help="fail instead of skipping a missing peer"
    )
    parser.add_argument("--out", type=Path, default=BENCH / "out", help="report directory")
    parser.add_argument(
        "--no-netns", action="store_true", help="stay in the host's network namespace"
    )
    parser.add_argument(
        "--fault",
        choices=sorted(FAULTS),
        help="inject this KV-event stream fault into one engine a third into each window "
        "and report TTFT's recovery (use a longer --duration, e.g. 36)",
    )
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace) -> Settings:
    by_name = {target.name: target for target in TARGETS}
    names = [name.strip() for name in args.targets.split(",") if name.strip()]
    if unknown := [name for name in names if name not in by_name]:
        raise BenchError(f"unknown targets {unknown}; choose from {', '.join(by_name)}")
    targets = []
    for target in (by_name[name] for name in names):
        if target.program.exists():
            targets.append(target)
        elif target.peer and not args.require_peers:
            _say(f"skipping {target.name}: {target.program} not found (run bench/peers.sh)")
        else:
            raise BenchError(f"{target.name}: {target.program} not found")
    rates = args.rates or ("7" if args.quick else "3,7,11")
    return Settings(
        rates=tuple(float(rate) for rate in rates.split(",")),
        warmup_requests=args.warmup if args.warmup is not None else (20 if args.quick else 60),
        duration_s=args.duration if args.duration is not None else (6.0 if args.quick else 14.0),
        drain_s=args.drain,
        targets=tuple(targets),
        require_peers=args.require_peers,
        out_dir=args.out,
        shape=WorkloadShape(),
        fault=args.fault,
    )


def _report(
    rows: Sequence[Row],
    recoveries: Sequence[Recovery],
    skipped: dict[str, str],
    settings: Settings,
    started: str,
    took_s: float,
) -> str:
    shape = settings.shape
    notes = [f"- {name} not measured: {reason}" for name, reason in skipped.items()]
    return "\n".join(
        [
            f"# Routing quality, {started} UTC",
            "",
            f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, "
            f"Python {platform.python_version()}; took {took_s:.0f} s",
            f"- fleet: {ENGINES} sim-engines, --kv-blocks {KV_BLOCKS} --block-size 16 "
            f"--prefill-tokens-per-s {PREFILL_TOKENS_PER_S} --token-delay {TOKEN_DELAY_S}",
            f"- workload: {shape}",
            f"- per run: caches reset, warm-up {settings.warmup_requests} requests, "
            f"{settings.duration_s:g} s measured, "
            f"drain {settings.drain_s:g} s; Poisson arrivals, open loop",
            "",
            render_table(rows),
            "",
            *notes,
            "",
            highest_load_summary(rows),
            "",
            render_recoveries(recoveries),
            "",
        ]
    )


def _run(settings: Settings) -> int:
    started = datetime.datetime.now(datetime.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    log_dir = settings.out_dir / f"routing-{stamp}-logs"
    rows: list[Row] = []
    recoveries: list[Recovery] = []
    skipped: dict[str, str] = {}
    began = time.monotonic()
    with Processes(log_dir) as procs:
        engines = start_engines(procs)
        for target in settings.targets:
            try:
                rows += run_target(procs, target, engines, settings, recoveries)
            except BenchError as error:
                skipped[target.name] = str(error).splitlines()[0]
                _say(f"{target.name} not measured: {error}")
    report = _report(
        rows,
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
    _say(f"report: {settings.out_dir / f'routing-{stamp}.md'}\nlogs: {log_dir}")
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
