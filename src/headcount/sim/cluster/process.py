"""`headcount serve` as a real child process on loopback, judged only from outside.

A router run this way has its own interpreter, event loop and signal handling,
exactly as in a pod; what it does is seen through its HTTP endpoints and its
log, never through its objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
from pathlib import Path
from typing import IO

from headcount.sim.cluster.client import RouterClient
from headcount.sim.cluster.flags import RouterFlags, serve_command
from headcount.sim.cluster.polling import wait_until
from headcount.sim.loopback import free_port

__all__ = ["RouterProcess", "stop_child"]

_HOST = "127.0.0.1"


class RouterProcess:
    """`async with RouterProcess(flags) as router:` a router on a free port of 127.0.0.1.

    Entering starts it and waits until it answers `/livez` (200 or 503) or
    `ready_timeout` passes (`TimeoutError`, the process stopped); leaving sends
    SIGTERM and waits, bounded, for it to end. Its output goes to `log_path`
    (a new temporary directory unless given); `router.client` talks to it.
    """

    def __init__(
        self, flags: RouterFlags, *, log_path: Path | None = None, ready_timeout: float = 15.0
    ) -> None:
        self.port = free_port(_HOST)
        self.url = f"http://{_HOST}:{self.port}"
        self.client = RouterClient(self.url)
        self._probe = RouterClient(self.url, timeout=1.0)
        self.command = serve_command(flags, host=_HOST, port=self.port)
        self.log_path = log_path or (
            Path(tempfile.mkdtemp(prefix="headcount-router-")) / f"router-{self.port}.log"
        )
        self.process: asyncio.subprocess.Process | None = None
        self.returncode: int | None = None
        self._ready_timeout = ready_timeout
        self._log: IO[bytes] | None = None

    async def __aenter__(self) -> RouterProcess:
        self._log = self.log_path.open("wb")
        self.process = await asyncio.create_subprocess_exec(
            *self.command, stdout=self._log, stderr=self._log
        )
        try:
            await wait_until(
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
            raise RuntimeError(f"router exited with {self.process.returncode}: {self.log()}")
        return await self._probe.status_of("/livez") in (200, 503)

    async def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then wait; SIGKILL if it has not ended within `timeout`. Its exit code."""
        if self.process is None:
            return None
        await stop_child(self.process, timeout)
        self.returncode = self.process.returncode
        if self._log is not None:
            self._log.close()
        return self.returncode

    def log(self) -> str:
        """The end of what the router wrote, for a failure message."""
        return self.log_path.read_text(errors="replace")[-4000:]


async def stop_child(process: asyncio.subprocess.Process, timeout: float = 20.0) -> None:
    """SIGTERM `process` unless it has ended, then wait; SIGKILL it after `timeout`."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
