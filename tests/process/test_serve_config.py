"""`headcount serve --config FILE` with `HEADCOUNT_*` variables, started for real.

The file sets the listener, the engines and the probe interval, a variable
moves health and metrics to an admin port, and a flag overrides the file's
routing: the process must serve as the three together say, and
`--print-config` must name where each of those values came from.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from asyncio.subprocess import PIPE
from pathlib import Path

import aiohttp
import pytest

from headcount.sim.cluster import PYTHON_CLI
from headcount.sim.engine import EngineSimConfig, running_engine
from headcount.sim.loopback import free_port
from tests.support import wait_until

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

HOST = "127.0.0.1"
TIMEOUT = aiohttp.ClientTimeout(total=5)


def _config(path: Path, port: int, engine_url: str) -> Path:
    path.write_text(
        f'host = "{HOST}"\n'
        f"port = {port}\n"
        f'backends = ["{engine_url}"]\n'
        'probe-interval = "200ms"\n'
        'routing = "round-robin"\n'
        "ready_requires_engines = true\n"
    )
    return path


async def _status(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(url) as response:
            return response.status
    except aiohttp.ClientError:
        return 0


async def test_serve_runs_as_the_config_file_the_environment_and_the_flags_say(
    tmp_path: Path,
) -> None:
    port, admin_port = free_port(HOST), free_port(HOST)
    env = {**os.environ, "HEADCOUNT_ADMIN_PORT": str(admin_port)}
    async with running_engine(EngineSimConfig(model="sim-model")) as engine:
        config = _config(tmp_path / "headcount.toml", port, engine.url)
        argv = [*PYTHON_CLI, "serve", "--config", str(config), "--routing", "least-loaded"]
        printing = await asyncio.create_subprocess_exec(
            *argv, "--print-config", env=env, stdout=PIPE, stderr=PIPE
        )
        out, err = await asyncio.wait_for(printing.communicate(), 30)
        assert printing.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        assert f"port = {port}  # file {config}:2" in lines
        assert f"admin-port = {admin_port}  # env HEADCOUNT_ADMIN_PORT" in lines
        assert 'routing = "least-loaded"  # flag' in lines
        assert "ready-requires-engines = true  # file " + f"{config}:6" in lines
        assert "drain-delay = 5.0  # default" in lines

        log = (tmp_path / "router.log").open("wb")
        process = await asyncio.create_subprocess_exec(*argv, env=env, stdout=log, stderr=log)
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                admin = f"http://{HOST}:{admin_port}"

                async def ready() -> bool:
                    assert process.returncode is None, (tmp_path / "router.log").read_text()
                    return await _status(session, f"{admin}/readyz") == 200

                await wait_until(ready, timeout=20, what="/readyz on the admin port from env")
                assert await _status(session, f"http://{HOST}:{port}/readyz") == 404
                async with session.get(f"http://{HOST}:{port}/v1/models") as response:
                    assert response.status == 200
                    assert "sim-model" in await response.text()
                assert await _status(session, f"{admin}/metrics") == 200
        finally:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 30)
            log.close()


@pytest.mark.parametrize(
    ("toml", "environ", "needle"),
    [
        ("prot = 8080\n", {}, ":1: unknown setting 'prot'; did you mean port (--port)?"),
        ("port = 8080\n", {"HEADCOUNT_PORT": "http"}, "HEADCOUNT_PORT=http: invalid port"),
    ],
)
def test_a_bad_setting_stops_serve_with_one_line_and_status_2(
    tmp_path: Path, toml: str, environ: dict[str, str], needle: str
) -> None:
    config = tmp_path / "headcount.toml"
    config.write_text(toml)
    result = subprocess.run(
        [*PYTHON_CLI, "serve", "--config", str(config)],
        env={**os.environ, **environ},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("headcount serve: error: ")
    assert needle in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
