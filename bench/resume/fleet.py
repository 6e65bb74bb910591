"""The engines: simulator processes on loopback addresses, crashed and restarted in place.

Each engine is a `python -m headcount.sim.engine` process on its own loopback
address, all on one port, so a restarted engine is the same URL (a pod
restarting behind the same address) and a router's static list stays true.
A crash is SIGKILL to the engine's process group: no shutdown, the kernel
resets the connections, as when a node or a container dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass

import aiohttp

from bench.common.harness import BenchError
from bench.common.processes import Proc, Processes
from headcount.sim.cluster import wait_until

__all__ = ["Engine", "Fleet"]

_START_TIMEOUT_S = 30.0


@dataclass
class Engine:
    index: int
    host: str
    port: int
    proc: Proc | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        """Also the engine's name in headcount's logs (a static engine is named by its URL)."""
        return f"http://{self.host}:{self.port}"


class Fleet:
    """The engines of one router's run; `label` prefixes their log files."""

    def __init__(
        self,
        procs: Processes,
        label: str,
        hosts: list[str],
        port: int,
        token_delay: float,
        model: str,
    ) -> None:
        self.procs = procs
        self.label = label
        self.token_delay = token_delay
        self.model = model
        self.engines = [Engine(index, host, port) for index, host in enumerate(hosts)]

    @property
    def urls(self) -> list[str]:
        return [engine.url for engine in self.engines]

    async def start_all(self) -> None:
        await asyncio.gather(*(self.start(engine) for engine in self.engines))

    async def start(self, engine: Engine) -> None:
        """Start `engine`'s process and wait until it answers."""
        engine.starts += 1
        argv = [sys.executable, "-m", "headcount.sim.engine", "--host", engine.host]
        argv += ["--port", str(engine.port), "--model", self.model]
        argv += ["--name", f"engine-{engine.index}", "--token-delay", str(self.token_delay)]
        name = f"{self.label}-engine-{engine.index}"
        proc = engine.proc = self.procs.start(name, argv)

        async def answers() -> bool:
            if not proc.alive():
                raise BenchError(f"{name} exited:\n{proc.log_tail()}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                timeout = aiohttp.ClientTimeout(total=1)
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    async with session.get(engine.url + "/sim/stats") as response:
                        return response.status == 200
            return False

        try:
            await wait_until(answers, timeout=_START_TIMEOUT_S, interval=0.05, what=name)
        except TimeoutError as exc:
            raise BenchError(f"{name} did not answer: {exc}") from None

    async def kill(self, engine: Engine) -> float:
        """SIGKILL `engine` (a crash); returns when it was sent (`time.monotonic()`)."""
        proc = engine.proc
        if proc is None:
            raise BenchError(f"engine {engine.index} is not running")
        at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        engine.proc = None
        await asyncio.to_thread(self.procs.stop, proc)  # reaps it
        return at

    async def stop_all(self) -> None:
        for engine in self.engines:
            if engine.proc is not None:
                await asyncio.to_thread(self.procs.stop, engine.proc)
                engine.proc = None
