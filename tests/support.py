"""Test helpers shared across the suite: polling with a deadline, free ports."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

__all__ = ["RouterProcess", "free_port", "wait_until", "wait_until_async"]

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_until(
    condition: Callable[[], T], *, timeout: float = 5.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll `condition` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await asyncio.sleep(interval)


async def wait_until_async(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout: float = 5.0,
    interval: float = 0.05,
    what: str = "",
) -> T:
    """Like `wait_until`, for a condition that must be awaited (an HTTP call, say)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = await condition()
            if value:
                return value
        except Exception as exc:  # the condition may fail while the system converges
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or condition}"
                f" (last error: {last_error!r})"
            )
        await asyncio.sleep(interval)


class RouterProcess:
    """`headcount serve` as a real child process on loopback, for scenario tests.

    `async with RouterProcess(["--discovery", "static", ...]) as router:` starts it
    on a free port, waits until it answers `/livez`, and on exit sends SIGTERM and
    waits (bounded) for it to end. Its stderr is kept in `router.log_path`.
    """

    def __init__(
        self, args: list[str], *, log_dir: Path | None = None, ready_timeout: float = 15.0
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._args = args
        self._ready_timeout = ready_timeout
        self._log_dir = log_dir or Path(tempfile.mkdtemp(prefix="headcount-router-"))
        self.log_path = self._log_dir / f"router-{self.port}.log"
        self.process: asyncio.subprocess.Process | None = None
        self.returncode: int | None = None

    async def __aenter__(self) -> RouterProcess:
        self._log = self.log_path.open("wb")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "headcount.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self._args,
            stdout=self._log,
            stderr=self._log,
        )
        try:
            await wait_until_async(
                self._answers, timeout=self._ready_timeout, what=f"router on {self.url}"
            )
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _answers(self) -> bool:
        if self.process is not None and self.process.returncode is not None:
            raise AssertionError(f"router exited with {self.process.returncode}: {self.log()}")
        timeout = aiohttp.ClientTimeout(total=1)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(self.url + "/livez") as response:
                return response.status in (200, 503)

    async def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then wait; SIGKILL if it does not end within `timeout`."""
        if self.process is None:
            return None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self.returncode = self.process.returncode
        self._log.close()
        return self.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    async def get_json(self, path: str) -> Any:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(self.url + path) as response:
                return await response.json(content_type=None)

    async def status_of(self, path: str) -> int:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(self.url + path) as response:
                await response.read()
                return response.status
