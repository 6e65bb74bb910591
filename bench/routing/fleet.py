"""The routing suite's fleet: four sim-engines with prefix caches, and what it reads of them."""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from bench.common.harness import BenchError
from bench.common.httpcall import HttpAnswer, http_call
from bench.common.processes import Proc, Processes, block_until
from headcount.sim.loopback import free_port_on_all

__all__ = [
    "BLOCK_SIZE",
    "ENGINES",
    "KV_BLOCKS",
    "MODEL",
    "PREFILL_TOKENS_PER_S",
    "TOKEN_DELAY_S",
    "Engine",
    "counters",
    "reset_caches",
    "served",
    "start_engines",
]

MODEL = "sim-model"
ENGINES = 4
KV_BLOCKS = 720
BLOCK_SIZE = 16
PREFILL_TOKENS_PER_S = 4000
TOKEN_DELAY_S = 0.02
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


def start_engines(procs: Processes) -> list[Engine]:
    engines = []
    addresses = [f"127.0.0.{10 + index}" for index in range(1, ENGINES + 1)]
    events, replay = free_port_on_all(addresses), free_port_on_all(addresses)
    for index, host in enumerate(addresses, start=1):
        port = free_port_on_all([host])
        argv = [sys.executable, "-m", "headcount.sim.engine", "--host", host]
        argv += ["--port", str(port), "--model", MODEL, "--token-delay", str(TOKEN_DELAY_S)]
        argv += ["--kv-blocks", str(KV_BLOCKS), "--block-size", str(BLOCK_SIZE)]
        argv += ["--prefill-tokens-per-s", str(PREFILL_TOKENS_PER_S)]
        argv += ["--kv-events-port", str(events), "--kv-events-replay-port", str(replay)]
        argv += ["--kv-events-topic", "", "--name", f"engine-{index}"]
        proc = procs.start(f"engine-{index}", argv, port=port)
        engines.append(Engine(proc, host, port, events, replay))
    for engine in engines:
        block_until(
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
        block_until(functools.partial(_idle, engine), 60, f"{engine.proc.name} to go idle")
        block_until(
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
