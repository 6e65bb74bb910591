"""Running the overhead suite: two engines throughout, routers per workload, rounds of wrk.

Every router is started fresh per workload, checked and warmed up once, then
measured once per round, the order rotated by one per round. The method:
bench/overhead/__init__.py.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.common.gateway import start_envoy
from bench.common.harness import BenchError, say
from bench.common.httpcall import http_call, ok
from bench.common.processes import Proc, Processes, block_until
from bench.common.procfs import tree_cpu_seconds
from bench.overhead.targets import (
    ENGINES,
    MODEL,
    STREAM_CHUNKS,
    FleetCheck,
    Launch,
    Target,
    Workload,
)
from bench.overhead.wrk import WrkResult, run_wrk
from headcount.sim.loopback import free_port

__all__ = ["Bench", "Live", "Sample", "Settings", "WorkloadResult"]

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Sample:
    """One wrk run against one target, with the CPU the router and engines spent on it."""

    wrk: WrkResult
    router_cpu_s: float | None
    engines_cpu_s: float
    gateway_cpu_s: float | None
    """Envoy's, for a router behind it (the router is then its endpoint picker)."""
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

    @property
    def gateway_us(self) -> float | None:
        return self._per_request_us(self.gateway_cpu_s)


@dataclass
class Live:
    """A target ready to measure in the current workload."""

    target: Target
    port: int
    router: Proc | None
    gateway: Proc | None
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


def _fleet_complete(port: int, check: FleetCheck, headers: dict[str, str]) -> bool:
    answer = http_call(port, "GET", check.path, headers=headers)
    if answer is None or not answer.ok:
        return False
    try:
        document = json.loads(answer.body)
    except ValueError:
        return False
    return _count_matching(document, check.key, check.value) >= ENGINES


def _answer_problem(port: int, workload: Workload, headers: dict[str, str]) -> str | None:
    """What is wrong with one answer to the workload's request, if anything."""
    answer = http_call(port, "POST", CHAT_PATH, workload.body(), 10, headers=headers)
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
            block_until(
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
                for proc in (entry.gateway, entry.router):
                    if proc is not None:
                        self._procs.stop(proc)
        measured = [entry for entry in live if entry.target.name not in skipped]
        return WorkloadResult(workload, measured, skipped)

    def _prepare(self, workload: Workload) -> tuple[list[Live], dict[str, str]]:
        live: list[Live] = []
        skipped: dict[str, str] = {}
        for target in self._settings.targets:
            router = gateway = None
            try:
                if target.command is None:
                    port = self._engine_ports[0]
                else:
                    router, gateway, port = self._start_router(target, workload)
            except BenchError as error:
                skipped[target.name] = f"did not start: {_brief(error)}"
                say(f"{workload.name}: {target.name} skipped: {error}")
                continue
            note = _answer_problem(port, workload, dict(target.headers))
            if note is not None:
                say(f"{workload.name}: {target.name}: {note}")
            live.append(Live(target, port, router, gateway, note))
        return live, skipped

    def _start_router(self, target: Target, workload: Workload) -> tuple[Proc, Proc | None, int]:
        """The router, and Envoy in front of it for a target with `envoy_body_modes`; the
        client port."""
        assert target.command is not None
        launch = Launch(
            port=free_port(),
            metrics_port=free_port(),
            picker_port=free_port(),
            backends=tuple(f"http://127.0.0.1:{port}" for port in self._engine_ports),
            files=self._log_dir,
        )
        headers = dict(target.headers)
        name = f"{workload.name}-{target.name}"
        modes = target.envoy_body_modes
        client_port = None if modes else launch.port
        router = self._procs.start(name, target.command(launch), port=client_port)
        gateway = None
        timeout_s = self._settings.start_timeout_s
        try:
            if modes:
                gateway = start_envoy(
                    self._procs,
                    f"{name}-envoy",
                    listen_port=launch.port,
                    picker_port=launch.picker_port,
                    body_modes=modes,
                    directory=self._log_dir,
                )
            block_until(
                lambda: ok(
                    http_call(launch.port, "POST", CHAT_PATH, workload.body(), 5, headers=headers)
                ),
                timeout_s,
                f"{target.name} to answer a request",
                router,
            )
            if target.fleet_check is not None:
                check = target.fleet_check
                port = launch.metrics_port if check.on_metrics_port else launch.port
                block_until(
                    lambda: _fleet_complete(port, check, headers),
                    timeout_s,
                    f"{target.name} to list {ENGINES} ready engines at {check.path}",
                    router,
                )
        except BenchError:
            for proc in (gateway, router):
                if proc is not None:
                    self._procs.stop(proc)
            raise
        return router, gateway, launch.port

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
            say(f"{workload.name}: {entry.target.name} skipped in {when}: {error}")
            return
        if round_index is not None:
            entry.samples.append(sample)
            say(_progress(workload, round_index, entry))

    def _sample(self, entry: Live, workload: Workload, body: Path, duration_s: int) -> Sample:
        router = entry.router
        if router is not None and not router.alive():
            raise BenchError(f"{router.name} exited:\n{router.log_tail()}")
        split = None if router else [f"127.0.0.1:{port}" for port in self._engine_ports]
        router_before = tree_cpu_seconds(router.pid) if router else 0.0
        gateway = entry.gateway
        gateway_before = tree_cpu_seconds(gateway.pid) if gateway else 0.0
        engines_before = self._engines_cpu_s()
        served_before = self._served()
        result = run_wrk(
            f"http://127.0.0.1:{entry.port}{CHAT_PATH}",
            body,
            workload.connections,
            self._settings.threads,
            duration_s,
            split,
            entry.target.headers,
        )
        engines_cpu_s = self._engines_cpu_s() - engines_before
        router_cpu_s = tree_cpu_seconds(router.pid) - router_before if router else None
        gateway_cpu_s = tree_cpu_seconds(gateway.pid) - gateway_before if gateway else None
        served_after = self._served()
        served = None
        if served_before is not None and served_after is not None:
            served = tuple(a - b for a, b in zip(served_after, served_before, strict=True))
        return Sample(result, router_cpu_s, engines_cpu_s, gateway_cpu_s, served)

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


def _answers_http(port: int) -> bool:
    """Up, whatever the status: the per-target probe judges the answers."""
    return http_call(port, "GET", "/v1/models") is not None


def _progress(workload: Workload, round_index: int, entry: Live) -> str:
    sample = entry.samples[-1]
    cpu = f", router {sample.router_us:.0f} µs/req" if sample.router_us is not None else ""
    if sample.gateway_us is not None:
        cpu += f", Envoy {sample.gateway_us:.0f} µs/req"
    errors = sample.wrk.non_2xx + sample.wrk.socket_errors
    return (
        f"{workload.name} round {round_index + 1}: {entry.target.name:<13} "
        f"{sample.wrk.ok_per_s:8.0f} req/s  p50 {sample.wrk.p50_ms:6.2f} ms  "
        f"p99 {sample.wrk.p99_ms:6.2f} ms  errors {errors}{cpu}"
    )
