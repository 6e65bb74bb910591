"""Measure what headcount costs per request, beside direct access and the Rust peer routers.

Method (the numbers are only as good as this):

- The run re-executes itself in a private network namespace (`unshare --net`,
  loopback only): nothing leaves the machine, no port on the host can collide,
  and peers that fetch a tokenizer from a hub fail at once instead of hanging.
- Two engine simulators start once and serve every target, with a 1 µs token
  delay so each streamed chunk leaves in its own write (at 0 the simulator sends
  the whole stream at once, and a router would forward one read, not 20 chunks).
- Targets, each a small declarative entry in `TARGETS`: `direct` (no router: wrk's
  threads are pinned one per engine by lua/openai.lua, so each engine gets half
  the connections, the round-robin a router does, at no cost), `headcount`,
  `vllm-router` and `sglang-router`, all round-robin over the same two engines.
- Workloads: chat non-streaming at 32 and 128 connections, streaming (20 chunks)
  at 32. wrk counts a streamed (chunked) response once, when its last chunk
  arrives, and its latency is the whole stream's.
- Per workload, every router is started fresh, checked (it lists both engines as
  ready where it can say; an answer is well-formed, a stream has 20 chunks) and
  warmed up once, then kept alive across rounds. Each round measures every
  target once, the order rotated by one per round, so drift on a noisy 2-core
  machine hits every target alike. Medians over rounds are reported.
- Router CPU per request = utime+stime of the router's process tree (all threads
  and child processes) over one wrk run / 2xx responses of that run. Non-2xx and
  socket errors are reported beside: a router answering 503s fast is not fast.
  So is how the engines split the work (from the simulator's `/sim/stats`).
- Everything shares the two cores (wrk, engines, router): throughput ratios show
  the router's cost relative to the engines'; CPU µs/request is the steadier number.

Usage: `.venv/bin/python bench/overhead.py [--quick] [--rounds N] [--duration S]
[--targets direct,headcount,vllm-router,sglang-router] [--workloads chat-c32,...]
[--baseline REV ...]`. `--baseline` measures headcount as it was at a git revision in the
same rounds as today's, for the before/after of a hot-path change.
Peers and wrk: `bench/peers.sh` installs them (idempotent). The report is printed
and written to `bench/out/overhead-<timestamp>.md`, logs beside it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from _harness import (
    BenchError,
    HttpAnswer,
    Proc,
    Processes,
    WrkResult,
    free_port,
    headcount_at,
    http_call,
    run_benchmark,
    run_wrk,
    tree_cpu_seconds,
    wait_until,
)

from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import RouterFlags, serve_command

__all__ = ["TARGETS", "WORKLOADS", "Launch", "Target", "Workload", "main"]

BENCH = Path(__file__).resolve().parent
PEERS_BIN = BENCH / ".venv-peers" / "bin"
VENV_BIN = Path(sys.executable).parent
MODEL = "sim-model"
ENGINES = 2
STREAM_CHUNKS = 20
CHAT_PATH = "/v1/chat/completions"
DEFAULT_ENGINE_CMD = (
    "{python} -m headcount.sim.engine --host 127.0.0.1 --port {port} --model {model} "
    "--token-delay {token_delay}"
)
DEFAULT_TOKEN_DELAY_S = 1e-6
"""Not 0: at 0 the simulator sends a whole stream in one write, so a router would forward
one read instead of 20 chunks; 1 µs makes every chunk leave in its own write."""
PEERS_HINT = "run bench/peers.sh to install it"


@dataclass(frozen=True)
class Launch:
    """Where a router listens and what it routes to."""

    port: int
    metrics_port: int
    """A spare free port: the peers open a Prometheus listener (29000 for both by default)."""
    backends: tuple[str, ...]


@dataclass(frozen=True)
class FleetCheck:
    """Ready when `path` answers JSON holding one object per engine whose `key` is `value`."""

    path: str
    key: str
    value: object


@dataclass(frozen=True)
class Target:
    """One way to reach the engines: directly, or through a router that `command` starts."""

    name: str
    program: Path | None = None
    """The installed executable; absent means the target is skipped. None: no router."""
    command: Callable[[Launch], list[str]] | None = None
    fleet_check: FleetCheck | None = None
    """For routers that answer before every engine is registered."""
    peer: bool = False
    install_hint: str = ""


def _headcount(
    launch: Launch, program: tuple[str, ...] = (str(VENV_BIN / "headcount"),)
) -> list[str]:
    flags = RouterFlags(
        discovery=DiscoveryMode.STATIC,
        backends=launch.backends,
        routing=RoutingName.ROUND_ROBIN,
    )
    return serve_command(flags, host="127.0.0.1", port=launch.port, program=program)


def baseline_target(rev: str, out_dir: Path) -> Target:
    """headcount as it was at git revision `rev`, measured beside today's in the same rounds."""
    commit, program = headcount_at(rev, out_dir)
    return Target(
        f"headcount@{commit}",
        program=Path(sys.executable),
        command=functools.partial(_headcount, program=program),
        fleet_check=FleetCheck("/engines", "state", "ready"),
    )


def _vllm_router(launch: Launch) -> list[str]:
    return [
        str(PEERS_BIN / "vllm-router"),
        "--host",
        "127.0.0.1",
        "--port",
        str(launch.port),
        "--worker-urls",
        *launch.backends,
        "--policy",
        "round_robin",
        "--prometheus-port",
        str(launch.metrics_port),
        "--worker-startup-timeout-secs",
        "30",
        "--log-level",
        "warning",
    ]


def _sglang_router(launch: Launch) -> list[str]:
    return [
        str(PEERS_BIN / "python"),
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(launch.port),
        "--worker-urls",
        *launch.backends,
        "--policy",
        "round_robin",
        "--prometheus-port",
        str(launch.metrics_port),
        "--log-level",
        "warn",
    ]


TARGETS: tuple[Target, ...] = (
    Target("direct"),
    Target(
        "headcount",
        program=VENV_BIN / "headcount",
        command=_headcount,
        fleet_check=FleetCheck("/engines", "state", "ready"),
        install_hint="run `make install`",
    ),
    Target(
        "vllm-router",
        program=PEERS_BIN / "vllm-router",
        command=_vllm_router,
        peer=True,
        install_hint=PEERS_HINT,
    ),
    Target(
        "sglang-router",
        program=PEERS_BIN / "sglang-router",
        command=_sglang_router,
        fleet_check=FleetCheck("/workers", "is_healthy", True),
        peer=True,
        install_hint=PEERS_HINT,
    ),
)


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    connections: int
    stream: bool

    def body(self) -> bytes:
        return json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": STREAM_CHUNKS,
                "stream": self.stream,
            }
        ).encode()


WORKLOADS: tuple[Workload, ...] = (
    Workload("chat-c32", "chat, non-streaming, 32 connections", 32, stream=False),
    Workload("chat-c128", "chat, non-streaming, 128 connections", 128, stream=False),
    Workload("stream-c32", f"chat, streaming {STREAM_CHUNKS} chunks, 32 connections", 32, True),
)


@dataclass(frozen=True)
class Sample:
    """One wrk run against one target, with the CPU the router and engines spent on it."""

    wrk: WrkResult
    router_cpu_s: float | None
    engines_cpu_s: float
    served: tuple[int, ...] | None
    """Responses each engine served during the run; None if an engine does not say."""

    def _per_request_us(self, cpu_s: float | None) -> float | None:
        if cpu_s is None or self.wrk.ok_requests == 0:
            return None
        return cpu_s * 1e6 / self.wrk.ok_requests

    @property
    def router_us(self) -> float | None:
        return self._per_request_us(self.router_cpu_s)

    @property
    def engines_us(self) -> float | None:
        return self._per_request_us(self.engines_cpu_s)


@dataclass
class Live:
    """A target ready to measure in the current workload."""

    target: Target
    port: int
    router: Proc | None
    note: str | None
    samples: list[Sample] = field(default_factory=list)


@dataclass
class WorkloadResult:
    workload: Workload
    measured: list[Live]
    skipped: dict[str, str]


@dataclass(frozen=True)
class Settings:
    rounds: int
    duration_s: int
    warmup_s: int
    threads: int
    start_timeout_s: float
    engine_cmd: str
    token_delay_s: float
    targets: tuple[Target, ...]
    workloads: tuple[Workload, ...]
    require_peers: bool
    out_dir: Path


# --- starting and checking targets ------------------------------------------------


def _count_matching(node: object, key: str, value: object) -> int:
    if isinstance(node, dict):
        own = 1 if node.get(key) == value else 0
        return own + sum(_count_matching(child, key, value) for child in node.values())
    if isinstance(node, list):
        return sum(_count_matching(child, key, value) for child in node)
    return 0


def _fleet_complete(port: int, check: FleetCheck) -> bool:
    answer = http_call(port, "GET", check.path)
    if answer is None or not answer.ok:
        return False
    try:
        document = json.loads(answer.body)
    except ValueError:
        return False
    return _count_matching(document, check.key, check.value) >= ENGINES


def _answer_problem(port: int, workload: Workload) -> str | None:
    """What is wrong with one answer to the workload's request, if anything."""
    answer = http_call(port, "POST", CHAT_PATH, workload.body(), timeout_s=10)
    if answer is None:
        return "no answer to a probe request"
    if not answer.ok:
        return f"probe request answered {answer.status}: {answer.body[:200]!r}"
    if workload.stream:
        events = [line for line in answer.body.splitlines() if line.startswith(b"data:")]
        chunks = sum(1 for line in events if line.strip() != b"data: [DONE]")
        if chunks != STREAM_CHUNKS:
            return f"streamed {chunks} chunks, expected {STREAM_CHUNKS}"
        return None
    try:
        choices = json.loads(answer.body).get("choices")
    except (ValueError, AttributeError):
        choices = None
    return None if choices else f"answer is not a chat completion: {answer.body[:200]!r}"


# --- one run --------------------------------------------------------------------


class Bench:
    """One run: two engines shared by every workload, routers started per workload."""

    def __init__(self, procs: Processes, settings: Settings, log_dir: Path) -> None:
        self._procs = procs
        self._settings = settings
        self._log_dir = log_dir
        self._engines: list[Proc] = []
        self._engine_ports: list[int] = []

    def start_engines(self) -> None:
        template = self._settings.engine_cmd
        for index in range(1, ENGINES + 1):
            port = free_port()
            argv = shlex.split(
                template.format(
                    python=sys.executable,
                    port=port,
                    model=MODEL,
                    token_delay=self._settings.token_delay_s,
                )
            )
            self._engines.append(self._procs.start(f"engine-{index}", argv, port=port))
            self._engine_ports.append(port)
        for engine, port in zip(self._engines, self._engine_ports, strict=True):
            wait_until(
                functools.partial(_answers_http, port),
                self._settings.start_timeout_s,
                f"{engine.name} to answer HTTP",
                engine,
            )

    def run(self, workload: Workload) -> WorkloadResult:
        body = self._log_dir / f"body-{workload.name}.json"
        body.write_bytes(workload.body())
        live, skipped = self._prepare(workload)
        try:
            for entry in live:
                self._try_sample(entry, workload, body, None, skipped)
            for round_index in range(self._settings.rounds):
                shift = round_index % max(len(live), 1)
                for entry in live[shift:] + live[:shift]:
                    if entry.target.name not in skipped:
                        self._try_sample(entry, workload, body, round_index, skipped)
        finally:
            for entry in live:
                if entry.router is not None:
                    self._procs.stop(entry.router)
        measured = [entry for entry in live if entry.target.name not in skipped]
        return WorkloadResult(workload, measured, skipped)

    def _prepare(self, workload: Workload) -> tuple[list[Live], dict[str, str]]:
        live: list[Live] = []
        skipped: dict[str, str] = {}
        for target in self._settings.targets:
            router = None
            try:
                if target.command is None:
                    port = self._engine_ports[0]
                else:
                    router, port = self._start_router(target, workload)
            except BenchError as error:
                skipped[target.name] = f"did not start: {_brief(error)}"
                _say(f"{workload.name}: {target.name} skipped: {error}")
                continue
            note = _answer_problem(port, workload)
            if note is not None:
                _say(f"{workload.name}: {target.name}: {note}")
            live.append(Live(target, port, router, note))
        return live, skipped

    def _start_router(self, target: Target, workload: Workload) -> tuple[Proc, int]:
        assert target.command is not None
        launch = Launch(
            port=free_port(),
            metrics_port=free_port(),
            backends=tuple(f"http://127.0.0.1:{port}" for port in self._engine_ports),
        )
        name = f"{workload.name}-{target.name}"
        router = self._procs.start(name, target.command(launch), port=launch.port)
        timeout_s = self._settings.start_timeout_s
        try:
            wait_until(
                lambda: _ok(http_call(launch.port, "POST", CHAT_PATH, workload.body(), 5)),
                timeout_s,
                f"{target.name} to answer a request",
                router,
            )
            if target.fleet_check is not None:
                check = target.fleet_check
                wait_until(
                    lambda: _fleet_complete(launch.port, check),
                    timeout_s,
                    f"{target.name} to list {ENGINES} ready engines at {check.path}",
                    router,
                )
        except BenchError:
            self._procs.stop(router)
            raise
        return router, launch.port

    def _try_sample(
        self,
        entry: Live,
        workload: Workload,
        body: Path,
        round_index: int | None,
        skipped: dict[str, str],
    ) -> None:
        """Measure one round (None: the warm-up, not kept); a failure skips the target."""
        duration_s = self._settings.warmup_s if round_index is None else self._settings.duration_s
        try:
            sample = self._sample(entry, workload, body, duration_s)
        except BenchError as error:
            when = "warm-up" if round_index is None else f"round {round_index + 1}"
            skipped[entry.target.name] = f"{when}: {_brief(error)}"
            _say(f"{workload.name}: {entry.target.name} skipped in {when}: {error}")
            return
        if round_index is not None:
            entry.samples.append(sample)
            _say(_progress(workload, round_index, entry))

    def _sample(self, entry: Live, workload: Workload, body: Path, duration_s: int) -> Sample:
        router = entry.router
        if router is not None and not router.alive():
            raise BenchError(f"{router.name} exited:\n{router.log_tail()}")
        split = None if router else [f"127.0.0.1:{port}" for port in self._engine_ports]
        router_before = tree_cpu_seconds(router.pid) if router else 0.0
        engines_before = self._engines_cpu_s()
        served_before = self._served()
        result = run_wrk(
            f"http://127.0.0.1:{entry.port}{CHAT_PATH}",
            body,
            workload.connections,
            self._settings.threads,
            duration_s,
            split,
        )
        engines_cpu_s = self._engines_cpu_s() - engines_before
        router_cpu_s = tree_cpu_seconds(router.pid) - router_before if router else None
        served_after = self._served()
        served = None
        if served_before is not None and served_after is not None:
            served = tuple(a - b for a, b in zip(served_after, served_before, strict=True))
        return Sample(result, router_cpu_s, engines_cpu_s, served)

    def _served(self) -> tuple[int, ...] | None:
        """Each engine's served count from the simulator's `/sim/stats`, if all of them say."""
        counts = []
        for port in self._engine_ports:
            answer = http_call(port, "GET", "/sim/stats")
            try:
                count = json.loads(answer.body)["served"] if answer and answer.ok else None
            except (ValueError, KeyError, TypeError):
                count = None
            if not isinstance(count, int):
                return None
            counts.append(count)
        return tuple(counts)

    def _engines_cpu_s(self) -> float:
        return sum(tree_cpu_seconds(engine.pid) for engine in self._engines)


def _brief(error: BenchError) -> str:
    """One line for the report: the first line of the error and the last of the log it quotes."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if len(lines) == 1 else f"{lines[0].rstrip(':')} ... {lines[-1]}"


def _ok(answer: HttpAnswer | None) -> bool:
    return answer is not None and answer.ok


def _answers_http(port: int) -> bool:
    """Up, whatever the status: the per-target probe judges the answers."""
    return http_call(port, "GET", "/v1/models") is not None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _progress(workload: Workload, round_index: int, entry: Live) -> str:
    sample = entry.samples[-1]
    cpu = f", router {sample.router_us:.0f} µs/req" if sample.router_us is not None else ""
    errors = sample.wrk.non_2xx + sample.wrk.socket_errors
    return (
        f"{workload.name} round {round_index + 1}: {entry.target.name:<13} "
        f"{sample.wrk.ok_per_s:8.0f} req/s  p50 {sample.wrk.p50_ms:6.2f} ms  "
        f"p99 {sample.wrk.p99_ms:6.2f} ms  errors {errors}{cpu}"
    )


# --- report ---------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or not denominator:
        return "—"
    return f"{numerator / denominator:.2f}"


@dataclass(frozen=True)
class _Summary:
    ok_per_s: float | None
    low: float | None
    high: float | None
    p50_ms: float | None
    p99_ms: float | None
    non_2xx: int
    socket_errors: int
    router_us: float | None
    engines_us: float | None
    split: str
    """Each engine's share of the responses, in percent, over all rounds."""


def _split(samples: Sequence[Sample]) -> str:
    counts = [sample.served for sample in samples]
    if not counts or any(count is None for count in counts):
        return "—"
    totals = [sum(column) for column in zip(*(count for count in counts if count), strict=True)]
    whole = sum(totals)
    return "/".join(f"{100 * total / whole:.0f}" for total in totals) if whole else "—"


def _summarise(samples: Sequence[Sample]) -> _Summary:
    rates = [sample.wrk.ok_per_s for sample in samples]
    return _Summary(
        ok_per_s=_median(rates),
        low=min(rates, default=None),
        high=max(rates, default=None),
        p50_ms=_median([sample.wrk.p50_ms for sample in samples]),
        p99_ms=_median([sample.wrk.p99_ms for sample in samples]),
        non_2xx=sum(sample.wrk.non_2xx for sample in samples),
        socket_errors=sum(sample.wrk.socket_errors for sample in samples),
        router_us=_median([sample.router_us for sample in samples]),
        engines_us=_median([sample.engines_us for sample in samples]),
        split=_split(samples),
    )


_TABLE_HEAD = (
    "| target | 2xx req/s | min-max | p50 ms | p99 ms | non-2xx | socket err "
    "| router CPU µs/req | engines CPU µs/req | engine split % | req/s ÷ direct "
    "| router CPU ÷ vllm-router |\n"
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
)


def _workload_section(result: WorkloadResult) -> tuple[list[str], dict[str, _Summary]]:
    summaries = {entry.target.name: _summarise(entry.samples) for entry in result.measured}
    direct = summaries.get("direct")
    vllm = summaries.get("vllm-router")
    lines = [f"## {result.workload.title}", "", _TABLE_HEAD]
    for name, summary in summaries.items():
        lines.append(
            f"| {name} | {_fmt(summary.ok_per_s)} | {_fmt(summary.low)}-{_fmt(summary.high)} "
            f"| {_fmt(summary.p50_ms, 2)} | {_fmt(summary.p99_ms, 2)} | {summary.non_2xx} "
            f"| {summary.socket_errors} | {_fmt(summary.router_us)} | {_fmt(summary.engines_us)} "
            f"| {summary.split} "
            f"| {_ratio(summary.ok_per_s, direct.ok_per_s if direct else None)} "
            f"| {_ratio(summary.router_us, vllm.router_us if vllm else None)} |"
        )
    notes = [f"- {entry.target.name}: {entry.note}" for entry in result.measured if entry.note]
    notes += [f"- {name} not measured: {reason}" for name, reason in result.skipped.items()]
    if notes:
        lines += ["", *notes]
    return lines, summaries


def _ratios_section(all_summaries: dict[str, dict[str, _Summary]]) -> list[str]:
    lines = [
        "## headcount ratios (medians)",
        "",
        "| workload | req/s ÷ direct | req/s ÷ vllm-router | router CPU µs/req ÷ vllm-router |",
        "|---|--:|--:|--:|",
    ]
    for workload, summaries in all_summaries.items():
        ours = summaries.get("headcount")
        direct, vllm = summaries.get("direct"), summaries.get("vllm-router")
        lines.append(
            f"| {workload} "
            f"| {_ratio(ours.ok_per_s if ours else None, direct.ok_per_s if direct else None)} "
            f"| {_ratio(ours.ok_per_s if ours else None, vllm.ok_per_s if vllm else None)} "
            f"| {_ratio(ours.router_us if ours else None, vllm.router_us if vllm else None)} |"
        )
    return lines


def _tool_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    words = (done.stdout or done.stderr).split()
    return " ".join(words[:2]) or "unknown"


def _peer_versions() -> str:
    found = sorted(BENCH.glob(".venv-peers/lib/python*/site-packages/*_router-*.dist-info"))
    stems = (path.name.removesuffix(".dist-info").partition("-") for path in found)
    return ", ".join(f"{name.replace('_', '-')} {version}" for name, _, version in stems) or "none"


def render(
    results: Sequence[WorkloadResult], settings: Settings, started: str, log_dir: Path
) -> str:
    header = [
        f"# Router overhead, {started} UTC",
        "",
        f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        f"- load: {_tool_version(['wrk', '-v'])}; {settings.threads} threads, keep-alive, "
        f"{settings.rounds} rounds x {settings.duration_s} s per target, interleaved, "
        f"order rotated per round; warm-up {settings.warmup_s} s per target and workload",
        f"- engines: {ENGINES} x `{settings.engine_cmd}`, token delay {settings.token_delay_s} s",
        f"- peers: {_peer_versions()}",
        f"- logs: {settings.out_dir.name}/{log_dir.name}/",
        "- medians over rounds; errors summed over rounds; CPU per 2xx response; "
        "method in bench/overhead.py",
        "",
    ]
    body: list[str] = []
    all_summaries: dict[str, dict[str, _Summary]] = {}
    for result in results:
        lines, summaries = _workload_section(result)
        body += [*lines, ""]
        all_summaries[result.workload.name] = summaries
    return "\n".join(header + body + _ratios_section(all_summaries)) + "\n"


# --- command line ---------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--out", type=Path, default=BENCH / "out", help="report directory")
    parser.add_argument(
        "--no-netns", action="store_true", help="stay in the host's network namespace"
    )
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
            _say(f"skipping {target.name}: {target.program} not found ({target.install_hint})")
        else:
            raise BenchError(f"{target.name}: {target.program} not found ({target.install_hint})")
    return tuple(kept)


def _settings(args: argparse.Namespace) -> Settings:
    if shutil.which("wrk") is None:
        raise BenchError("wrk not found: run bench/peers.sh (or apt-get install wrk)")
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
    _say(f"report: {report_path}\nlogs: {log_dir}")
    if failed := _fatal(results, settings):
        _say(f"not measured: {', '.join(failed)}")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    return run_benchmark(lambda: _run(_settings(args)), args.no_netns)


if __name__ == "__main__":
    sys.exit(main())
