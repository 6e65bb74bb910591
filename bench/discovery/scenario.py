"""The discovery suite's scenario: the emulator holding the pods, and the worker measured on it.

What both sides share (namespace, selector, back-off), the API emulator as a
process with its admin API (`Cluster`: pods created, relabelled, deleted, faults
injected) and a worker process with its command pipe (`Worker`: one JSON line each
way per command, see `programs/worker.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.common.harness import BenchError
from bench.common.processes import Proc, Processes
from headcount.config import DiscoverySettings
from headcount.discovery.reflector import ReflectorTiming
from headcount.sim.apiserver import make_pod
from headcount.sim.loopback import free_port

__all__ = [
    "BACKOFF_INITIAL_S",
    "BACKOFF_MAX_S",
    "ENGINE_PORT",
    "NAMESPACE",
    "POLL_S",
    "SELECTOR",
    "SHORT_WATCH_S",
    "SOURCE_NAME",
    "WORKER",
    "Cluster",
    "JsonObject",
    "Worker",
    "emulator",
]

NAMESPACE = "default"
SELECTOR = "app=vllm"
SOURCE_NAME = "k8s-pods"
ENGINE_PORT = 8000
BACKOFF_INITIAL_S = DiscoverySettings().backoff_initial
BACKOFF_MAX_S = 1.0
"""Production's 30 s scaled down, so a blind period costs seconds, not half a minute."""
SHORT_WATCH_S = ReflectorTiming.short_watch
"""A watch that ends sooner without an event is an error and backs off."""
DRIVER_CONCURRENCY = 16
HTTP_TIMEOUT_S = 30.0
ASK_TIMEOUT_S = 120.0
POLL_S = 0.002
WORKER = "bench.discovery.programs.worker"
"""The measured side, run as `python -m` in a fresh process per run."""

JsonObject = dict[str, Any]


class Worker:
    """A worker process and its command pipe; killed with its process group on close."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self._process = process
        self._log_path = log_path

    @classmethod
    async def start(
        cls, kubeconfig: Path, backoff_max: float, log_path: Path, profile_dir: Path | None
    ) -> Worker:
        argv = [sys.executable, "-m", WORKER, "--kubeconfig", str(kubeconfig)]
        argv += ["--backoff-max", str(backoff_max)]
        if profile_dir is not None:
            argv += ["--profile-dir", str(profile_dir)]
        with log_path.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        return cls(process, log_path)

    async def ask(
        self, command: str, timeout_s: float = ASK_TIMEOUT_S, **fields: Any
    ) -> JsonObject:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps({"cmd": command, **fields}).encode() + b"\n")
        try:
            await asyncio.wait_for(stdin.drain(), timeout_s)
            line = await asyncio.wait_for(stdout.readline(), timeout_s)
        except (TimeoutError, ConnectionError) as exc:
            raise BenchError(f"worker: no answer to {command}: {exc!r}{self._tail()}") from exc
        if not line:
            raise BenchError(f"worker exited during {command}{self._tail()}")
        answer: JsonObject = json.loads(line)
        if "error" in answer:
            raise BenchError(f"worker: {command}: {answer['error']}{self._tail()}")
        return answer

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n" + "\n".join(self._log_path.read_text().splitlines()[-15:])
        return ""

    async def close(self) -> None:
        process = self._process
        if process.returncode is None and process.stdin is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                process.stdin.write(b'{"cmd": "quit"}\n')
                process.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 10)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if process.returncode is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 5)


class Cluster:
    """The emulator process, reached through its admin API; knows every pod's name and uid."""

    def __init__(self, proc: Proc, port: int, kubeconfig: Path, session: aiohttp.ClientSession):
        self.proc = proc
        self.port = port
        self.kubeconfig = kubeconfig
        self._session = session
        self._base = f"http://127.0.0.1:{port}"
        self.uids: dict[str, str] = {}
        self._ips = 0

    async def call(self, method: str, path: str, body: JsonObject | None = None) -> JsonObject:
        async with self._session.request(method, self._base + path, json=body) as response:
            answer: JsonObject = await response.json(content_type=None)
            if response.status >= 300:
                raise BenchError(f"{method} {path}: HTTP {response.status}: {answer}")
            return answer

    async def fault(self, name: str, **options: Any) -> None:
        await self.call("POST", f"/_sim/faults/{name}", options)

    async def create(self, names: Iterable[str]) -> None:
        async def one(name: str) -> None:
            self._ips += 1
            ip = f"127.{1 + self._ips // 65536}.{self._ips // 256 % 256}.{self._ips % 256}"
            pod = make_pod(name, namespace=NAMESPACE, labels={"app": "vllm", "model": "m-0"}, ip=ip)
            stored = await self.call("PUT", "/_sim/objects", pod)
            self.uids[name] = stored["metadata"]["uid"]

        await _bounded([one(name) for name in names])

    async def relabel(self, names: Sequence[str], count: int, tag: str) -> None:
        """`count` patches of the `model` label, round robin over `names`, each a new value."""

        async def one(i: int) -> None:
            name = names[i % len(names)]
            patch = {"metadata": {"labels": {"model": f"m-{tag}-{i}"}}}
            await self.call("PATCH", f"/_sim/objects/pods/{NAMESPACE}/{name}", patch)

        await _bounded([one(i) for i in range(count)])

    async def delete(self, names: Sequence[str]) -> list[str]:
        async def one(name: str) -> None:
            await self.call("DELETE", f"/_sim/objects/pods/{NAMESPACE}/{name}")

        await _bounded([one(name) for name in names])
        return [self.uids.pop(name) for name in names]

    async def wait_refused_then_reachable(self, timeout_s: float) -> float:
        """The monotonic time of the first accepted connection after one was refused."""
        deadline = time.monotonic() + timeout_s
        refused = False
        while time.monotonic() < deadline:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), 0.5
                )
            except (OSError, TimeoutError):
                refused = True
            else:
                reachable_at = time.monotonic()
                writer.close()
                if refused:
                    return reachable_at
            await asyncio.sleep(POLL_S)
        raise BenchError(f"the API was not refused, then reachable, within {timeout_s:g} s")


async def _bounded(jobs: Sequence[Awaitable[None]], limit: int = DRIVER_CONCURRENCY) -> None:
    gate = asyncio.Semaphore(limit)

    async def gated(job: Awaitable[None]) -> None:
        async with gate:
            await job

    await asyncio.gather(*(gated(job) for job in jobs))


@contextlib.asynccontextmanager
async def emulator(procs: Processes, log_dir: Path, size: int) -> AsyncIterator[Cluster]:
    port = free_port()
    kubeconfig = log_dir / f"kubeconfig-{size}"
    proc = procs.start(
        f"apiserver-{size}",
        [
            sys.executable,
            "-m",
            "headcount.sim.apiserver",
            "--port",
            str(port),
            "--kubeconfig-out",
            str(kubeconfig),
        ],
    )
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=DRIVER_CONCURRENCY)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            cluster = Cluster(proc, port, kubeconfig, session)
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    await cluster.call("GET", "/_sim/state")
                    if kubeconfig.is_file():
                        break
                if not proc.alive() or time.monotonic() > deadline:
                    raise BenchError(f"the emulator did not come up:\n{proc.log_tail()}")
                await asyncio.sleep(0.05)
            yield cluster
    finally:
        procs.stop(proc)
