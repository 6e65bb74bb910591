"""The overload suite's fleet: sim-engines with bounded concurrency, and a known capacity.

Each engine runs `MAX_RUNNING` requests at once (more wait in its own queue, as
vLLM's do) and spends `TOKEN_DELAY_S` per output token; every request asks for
`OUTPUT_TOKENS` tokens, so one request's service time is `SERVICE_S` and the
fleet serves `CAPACITY_RPS` requests a second, no more.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from bench.common.httpcall import http_call
from bench.common.processes import Proc, Processes, block_until
from headcount.sim.loopback import free_port

__all__ = [
    "CAPACITY_RPS",
    "ENGINES",
    "MAX_RUNNING",
    "MODEL",
    "OUTPUT_TOKENS",
    "SERVICE_S",
    "SLOTS",
    "TOKEN_DELAY_S",
    "Engine",
    "engines_waiting",
    "start_engines",
]

MODEL = "sim-model"
ENGINES = 4
MAX_RUNNING = 4
TOKEN_DELAY_S = 0.05
OUTPUT_TOKENS = 10
SERVICE_S = TOKEN_DELAY_S * OUTPUT_TOKENS
"""One request's time in a slot: 0.5 s (its first token after 0.05 s)."""
SLOTS = ENGINES * MAX_RUNNING
CAPACITY_RPS = SLOTS / SERVICE_S
"""32 requests/s."""


@dataclass(frozen=True)
class Engine:
    proc: Proc
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_engines(procs: Processes) -> list[Engine]:
    engines = []
    for index in range(1, ENGINES + 1):
        port = free_port()
        argv = [sys.executable, "-m", "headcount.sim.engine", "--port", str(port)]
        argv += ["--model", MODEL, "--token-delay", str(TOKEN_DELAY_S)]
        argv += ["--max-running", str(MAX_RUNNING), "--name", f"engine-{index}"]
        engines.append(Engine(procs.start(f"engine-{index}", argv, port=port), port))
    for engine in engines:
        block_until(
            lambda e=engine: http_call(e.port, "GET", "/health") is not None,
            30,
            f"{engine.proc.name} to answer",
            engine.proc,
        )
    return engines


async def engines_waiting(session: aiohttp.ClientSession, engines: Sequence[Engine]) -> int | None:
    """Requests waiting in the engines' own queues, summed (`/sim/stats`); None: one did not say."""
    total = 0
    for engine in engines:
        try:
            timeout = aiohttp.ClientTimeout(total=2)
            async with session.get(f"{engine.url}/sim/stats", timeout=timeout) as answer:
                total += int(json.loads(await answer.read())["waiting"])
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            return None
    return total
