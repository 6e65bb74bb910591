"""A real `redis-server` on loopback for the limits store's tests: started, stopped, started again.

The binary is `$HEADCOUNT_REDIS_SERVER`, else the one `make` extracts from
Debian's packages into `.cache/redis/` (the libraries extracted beside it are
put on `LD_LIBRARY_PATH`); without either the test is skipped. The server
keeps nothing on disk (`--save ""`, no AOF) and is ready once it answers
PING. `redis_server` is a fixture: import it into the test module.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headcount.sim.cluster.polling import wait_until
from headcount.sim.loopback import free_port
from tests.support.paths import REPO

__all__ = ["RedisServer", "redis_executable", "redis_server"]


def redis_executable() -> str:
    """The redis-server to run; skips the test when there is none."""
    configured = os.environ.get("HEADCOUNT_REDIS_SERVER")
    if configured:
        return configured
    extracted = REPO / ".cache/redis/usr/bin/redis-server"
    if not os.access(extracted, os.X_OK):
        pytest.skip(
            "redis-server not found: run through `make pytest` or set $HEADCOUNT_REDIS_SERVER"
        )
    return str(extracted)


class RedisServer:
    """One redis-server on 127.0.0.1 at a fixed port, so it can be stopped and started again."""

    def __init__(self, executable: str, directory: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self._executable = executable
        self._directory = directory
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start it and wait until it answers PING."""
        libraries = [str(p) for p in Path(self._executable).parents[1].glob("lib/*-linux-gnu")]
        inherited = [os.environ.get("LD_LIBRARY_PATH", "")]
        path = os.pathsep.join(entry for entry in [*libraries, *inherited] if entry)
        env = {**os.environ, "LD_LIBRARY_PATH": path}
        self._process = await asyncio.create_subprocess_exec(
            self._executable,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self._directory),
            "--logfile", str(self._directory / "redis.log"),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await wait_until(self._answers, timeout=10.0, what=f"redis-server on {self.url}")

    async def stop(self) -> None:
        """Stop it (SIGTERM, SIGKILL after 10 s) and wait until it is gone."""
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except TimeoutError:
            process.kill()
            await process.wait()

    async def _answers(self) -> bool:
        if self._process is None or self._process.returncode is not None:
            log = self._directory / "redis.log"
            told = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"redis-server exited: {told}")
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(b"PING\r\n")
            return await asyncio.wait_for(reader.readline(), 1.0) == b"+PONG\r\n"
        finally:
            writer.close()


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A started redis-server, stopped after the test."""
    server = RedisServer(redis_executable(), tmp_path)
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
