"""Running the hostile suite: two engines throughout; per phase a router, observer and attacker.

Beside each phase the router's RSS and fds are sampled and, in the hung-engine
phase, when it takes the engine out of rotation. The method and the targets:
bench/hostile/__init__.py.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.harness import BenchError
from bench.common.httpcall import http_call, ok
from bench.common.processes import Proc, Processes, block_until
from bench.common.procfs import rss_and_fds, tree_cpu_seconds
from bench.hostile.report import (
    EVIL_MODEL,
    NEW_STALL_TARGET_MS,
    SIM_MODEL,
    Phase,
    PhaseRun,
    Sample,
    Scale,
)
from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import PYTHON_CLI, RouterFlags, Timings, serve_command
from headcount.sim.loopback import free_port

__all__ = ["PHASES", "QUICK", "ROUTER_TIMINGS", "Bench"]

SAMPLE_EVERY_S = 0.1
NICE = ("nice", "-n", "10")
EVIL_ENGINE = "bench.hostile.programs.evil_engine"
OBSERVER = "bench.hostile.programs.observer"
ATTACKS = "bench.hostile.programs.attacks"
"""The suite's own programs, each run as `python -m` in a process of its own."""
EVIL_HOST = "127.0.0.2"
"""The adversarial engine's address: the KV-event ports a router looks for on each engine's
host are then its own (an attack's publisher binds them), not the healthy engine's."""
OBSERVER_HOST = "127.0.0.3"
"""The observer's source address; the attacks come from 127.0.0.1: two clients to a router."""
ROUTER_TIMINGS = Timings(probe_interval=1.0, drain_delay=0.0, drain_timeout=1.0)
"""Probes every second, so a probe attack recurs within a phase; no drain wait on stop."""


PHASES: tuple[Phase, ...] = (
    Phase("quiet", "no attack: the reference"),
    Phase("a-json", "31 MiB JSON bodies of nested empty arrays, unknown model", "json-bodies",
          uploads="json_clients"),
    Phase("b-chunks", "31 MiB bodies in 2-byte chunks, waves of uploads that disconnect",
          "chunk-waves", uploads="chunk_clients"),
    Phase("c-pipeline", "pipelined GET /v1/models, never read", "pipeline"),
    Phase("d-slowloris", "request heads at one byte per second", "slowloris"),
    Phase("e-idle", "idle connections", "idle"),
    Phase("f-metrics", "engine: 100 MiB /metrics", evil_mode="metrics"),
    Phase("f-adapters", "engine: /v1/models with 200,000 adapters", evil_mode="adapters"),
    Phase("f-header", "engine: a 64 MiB response header value", "evil-requests",
          evil_mode="header"),
    Phase("f-desync", "engine: extra and early responses (4 variants)", "desync",
          evil_mode="desync"),
    Phase("f-nested", "engine: /v1/models nested 100,000 deep", evil_mode="nested"),
    Phase("g-hung", "engine serving sim-model accepts, then never answers", evil_mode="hang",
          evil_model=SIM_MODEL, hold_evil=True),
    Phase("h-keyless", "keyless POST heads declaring 32 MiB, no body, on both ports",
          "keyless-heads", keyed=True, stall_target_ms=NEW_STALL_TARGET_MS),
    Phase("i-kv-frame", "KV events: frames of one BlockStored of 2 bytes a block",
          "kv-frames", kv=True, tokenizer="builtin", stall_target_ms=NEW_STALL_TARGET_MS),
    Phase("i-kv-flood", "KV events: a flood of small frames", "kv-flood", kv=True,
          tokenizer="builtin", min_attack_s=8.0, stall_target_ms=NEW_STALL_TARGET_MS),
    Phase("j-kv-index", "KV events: millions of blocks, then a gap and a hint's child",
          "kv-index", evil_mode="kv-huge", kv=True, tokenizer="builtin", min_attack_s=120.0,
          stall_target_ms=NEW_STALL_TARGET_MS),
    Phase("k-tokenize-unroutable", "32 KiB distinct chats for no model, with --tokenizer",
          "unroutable-chats", kv=True, tokenizer="builtin", min_attack_s=25.0,
          stall_target_ms=NEW_STALL_TARGET_MS),
    Phase("l-parse-fair", "31 MiB [[],[],...] bodies back to back beside 200 KB prompts",
          "wide-bodies", uploads="parse_clients", big_prompts=True, min_attack_s=10.0,
          stall_target_ms=NEW_STALL_TARGET_MS),
    Phase("m-tokenize-hung", "engine serving sim-model, zero load, /tokenize never answers",
          evil_mode="tokenize-hang", evil_model=SIM_MODEL, kv=True, min_attack_s=10.0,
          stall_target_ms=NEW_STALL_TARGET_MS),
)  # fmt: skip


QUICK = Scale(
    warmup_s=1.5,
    attack_s=3.0,
    aftermath_s=1.5,
    chunk_waves=2,
    slowloris_connections=200,
    client_timeout_s=10.0,
    kv_frame_sizes_mib=(8.0, 32.0),
)


# --- running a phase --------------------------------------------------------------


def _proc_sample(pid: int) -> Sample | None:
    measured = rss_and_fds(pid)
    if measured is None:
        return None
    return Sample(time.monotonic(), *measured, tree_cpu_seconds(pid))


@dataclass(frozen=True)
class _Router:
    """One phase's router: its command line, its ports, the client key it takes."""

    argv: list[str]
    port: int
    admin: int
    """Where `/livez` and `/engines` are: the `--admin-port`, else `port`."""
    key: str = ""
    kv_port: int | None = None
    replay_port: int | None = None


def _engines(port: int, timeout_s: float = 2.0) -> list[dict[str, Any]] | None:
    answer = http_call(port, "GET", "/engines", timeout_s=timeout_s)
    if answer is None or not answer.ok:
        return None
    try:
        engines: list[dict[str, Any]] = json.loads(answer.body)["engines"]
    except (ValueError, KeyError, TypeError):
        return None
    return engines


def _engine_at(port: int, url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    return next((e for e in _engines(port, timeout_s) or [] if e.get("url") == url), None)


class Bench:
    """Both engines for the whole run; a router, an observer and an attacker per phase."""

    def __init__(
        self,
        procs: Processes,
        scale: Scale,
        log_dir: Path,
        rss_limit_mib: float,
        program: tuple[str, ...] = PYTHON_CLI,
    ) -> None:
        self._procs = procs
        self._program = program
        self._scale = scale
        self._log_dir = log_dir
        self._rss_limit_mib = rss_limit_mib
        self._sim_port = free_port()
        self._evil_port = free_port(EVIL_HOST)
        self.sim_url = f"http://127.0.0.1:{self._sim_port}"
        self.evil_url = f"http://{EVIL_HOST}:{self._evil_port}"

    def start_engines(self) -> None:
        python = sys.executable
        sim = self._procs.start(
            "engine-sim",
            [
                python,
                "-m",
                "headcount.sim.engine",
                "--port",
                str(self._sim_port),
                "--model",
                SIM_MODEL,
            ],
            port=self._sim_port,
        )
        evil = self._procs.start(
            "engine-evil",
            [*NICE, python, "-m", EVIL_ENGINE, "--host", EVIL_HOST, "--port", str(self._evil_port)],
            port=self._evil_port,
        )
        block_until(lambda: ok(http_call(self._sim_port, "GET", "/sim/stats")), 30, "sim", sim)
        block_until(lambda: self._evil("GET", "/_evil/stats") is not None, 30, "evil", evil)

    def _evil(self, method: str, path: str, order: dict[str, str] | None = None) -> Any:
        body = json.dumps(order).encode() if order is not None else None
        answer = http_call(self._evil_port, method, path, body, timeout_s=5, host=EVIL_HOST)
        return json.loads(answer.body) if answer is not None and answer.ok else None

    def _set_evil(self, mode: str, model: str) -> None:
        if self._evil("POST", "/_evil/mode", {"mode": mode, "model": model}) is None:
            raise BenchError(f"the adversarial engine did not take mode {mode}")

    def _router(self, phase: Phase) -> _Router:
        port = free_port()
        kv = (free_port(EVIL_HOST), free_port(EVIL_HOST)) if phase.kv else (None, None)
        flags = RouterFlags(
            discovery=DiscoveryMode.STATIC,
            backends=(self.sim_url, self.evil_url),
            timings=ROUTER_TIMINGS,
            routing=RoutingName.KV_AWARE if phase.kv else None,
            tokenizer=phase.tokenizer,
            kv_events_port=kv[0],
            kv_events_replay_port=kv[1],
        )
        argv = serve_command(flags, host="127.0.0.1", port=port, program=self._program)
        if not phase.keyed:
            return _Router(argv, port, port, kv_port=kv[0], replay_port=kv[1])
        admin, key = free_port(), secrets.token_hex(16)
        keys = self._log_dir / f"api-keys-{phase.name}"
        keys.write_text(key + "\n")
        argv += [f"--api-keys-file={keys}", f"--admin-port={admin}"]
        return _Router(argv, port, admin, key, kv[0], kv[1])

    def run(self, phase: Phase) -> PhaseRun:
        self._set_evil("healthy", phase.evil_model)
        setup = self._router(phase)
        router = self._procs.start(f"router-{phase.name}", setup.argv, port=setup.port)
        try:
            block_until(lambda: self._both_ready(setup.admin), 30, "both engines ready", router)
            return self._measure(phase, router, setup)
        finally:
            self._procs.stop(router)
            self._set_evil("healthy", EVIL_MODEL)

    def _both_ready(self, port: int) -> bool:
        engines = _engines(port)
        return engines is not None and sum(e.get("state") == "ready" for e in engines) == 2

    def _measure(self, phase: Phase, router: Proc, setup: _Router) -> PhaseRun:
        scale, port = self._scale, setup.admin
        now = time.monotonic()
        t_attack = now + scale.warmup_s
        t_stop = t_attack + scale.attack_seconds(phase)
        t_end = t_stop + scale.aftermath_s
        run = PhaseRun(phase, t_attack, t_stop, t_end)
        observed = self._log_dir / f"observer-{phase.name}.jsonl"
        observer = self._procs.start(
            f"observer-{phase.name}",
            [
                *(sys.executable, "-m", OBSERVER, "--port", str(setup.port)),
                *("--source", OBSERVER_HOST),
                *("--livez-port", str(setup.admin), "--until", f"{t_end:.3f}"),
                *("--rate", str(scale.rate), "--tag", phase.name),
                *("--timeout", str(scale.client_timeout_s), "--out", str(observed)),
                *(("--api-key", setup.key) if setup.key else ()),
                *(("--big-rate", str(scale.big_rate)) if phase.big_prompts else ()),
            ],
        )
        attacker = None
        attacked = self._log_dir / f"attack-{phase.name}.json"
        if phase.attack is not None:
            attacker = self._procs.start(
                f"attack-{phase.name}",
                [
                    *(*NICE, sys.executable, "-m", ATTACKS, phase.attack),
                    *("--port", str(setup.port), "--start-at", f"{t_attack:.3f}"),
                    *("--stop-at", f"{t_stop:.3f}", "--out", str(attacked)),
                    *scale.attack_args(phase.attack),
                    *self._attack_ports(setup),
                ],
            )
        self._watch(run, router, port, until=t_attack)
        if phase.evil_mode is not None:
            self._set_evil(phase.evil_mode, phase.evil_model)
        self._watch(run, router, port, until=t_stop, attacker=attacker)
        if phase.evil_mode is not None and not phase.hold_evil:
            self._end_evil(run, port)
            self._set_evil("healthy", phase.evil_model)
        self._watch(run, router, port, until=t_end)
        if phase.hold_evil:
            # Until the last request the hung engine holds has ended; "after" is then.
            bound = t_end + self._scale.client_timeout_s + 10
            self._watch(run, router, port, until=bound, done=observer)
            run.t_end = time.monotonic()
            self._end_evil(run, port)
        self._finish(run, observer, attacker)
        records = _read_jsonl(observed)
        run.livez = [(r["t"], r["ms"], r["ok"]) for r in records if r["k"] == "l"]
        run.normal = [r for r in records if r["k"] == "n"]
        run.big = [r for r in records if r["k"] == "b"]
        if attacker is not None and attacked.is_file():
            run.attack_stats = json.loads(attacked.read_text())
        (self._log_dir / f"samples-{phase.name}.json").write_text(
            json.dumps([s.__dict__ for s in run.samples])
        )
        return run

    @staticmethod
    def _attack_ports(setup: _Router) -> list[str]:
        ports = ["--also-port", str(setup.admin)] if setup.admin != setup.port else []
        if setup.kv_port is not None:
            ports += ["--kv-endpoint", f"tcp://{EVIL_HOST}:{setup.kv_port}"]
            ports += ["--replay-endpoint", f"tcp://{EVIL_HOST}:{setup.replay_port}"]
        return ports

    def _watch(
        self,
        run: PhaseRun,
        router: Proc,
        port: int,
        until: float,
        attacker: Proc | None = None,
        done: Proc | None = None,
    ) -> None:
        """Sample the router every 100 ms until `until` (or `done` exits); watch for its death
        and runaway RSS; in a hung-engine phase, poll when the router ejects the engine."""
        polled_at = 0.0
        while time.monotonic() < until and (done is None or done.alive()):
            if not router.alive():
                if run.router_exit is None:
                    run.router_exit = router.popen.returncode
                    run.notes.append(
                        f"router exited ({run.router_exit}) during the phase: {router.log_tail(1)}"
                    )
                return
            sample = _proc_sample(router.pid)
            if sample is not None:
                run.samples.append(sample)
                if sample.rss_mib > self._rss_limit_mib and attacker is not None:
                    run.notes.append(
                        f"attack stopped early: router RSS {sample.rss_mib:.0f} MiB over "
                        f"--rss-limit {self._rss_limit_mib:.0f}"
                    )
                    self._procs.stop(attacker)
                    attacker = None
            if (
                run.phase.hold_evil
                and run.out_of_rotation_after_s is None
                and time.monotonic() >= run.t_attack
                and time.monotonic() - polled_at >= 0.5
            ):
                polled_at = time.monotonic()
                self._poll_hung(run, port)
            time.sleep(SAMPLE_EVERY_S)

    def _poll_hung(self, run: PhaseRun, port: int) -> None:
        """Note when the router first shows a probe error for the hung engine, and when it
        takes it out of rotation (unhealthy, or ejected as an outlier)."""
        engine = _engine_at(port, self.evil_url, timeout_s=1.0)
        if engine is None:
            return
        since = time.monotonic() - run.t_attack
        if engine.get("last_error") and run.probe_error_after_s is None:
            run.probe_error_after_s = since
        ejected = (engine.get("outlier") or {}).get("ejected") is True
        if engine.get("state") != "ready" or ejected:
            run.out_of_rotation_after_s = since

    def _end_evil(self, run: PhaseRun, port: int) -> None:
        """What the adversarial engine saw, and how the router shows it, while it is still
        adversarial (a good probe after the attack would clear its error)."""
        run.evil_stats = self._evil("GET", "/_evil/stats") or {}
        run.evil_engine = _engine_at(port, self.evil_url)

    def _finish(self, run: PhaseRun, observer: Proc, attacker: Proc | None) -> None:
        bound = self._scale.client_timeout_s + 15
        for proc in (observer, attacker):
            if proc is None:
                continue
            try:
                proc.popen.wait(timeout=max(1.0, run.t_end + bound - time.monotonic()))
            except subprocess.TimeoutExpired:
                run.notes.append(f"{proc.name} did not finish in time; stopped")
                self._procs.stop(proc)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
