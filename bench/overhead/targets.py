"""What the overhead suite measures: the targets (direct, headcount, the peers) and workloads."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common.gateway import BODY_MODES
from bench.common.harness import HEADCOUNT_BIN, headcount_at
from bench.common.peers import PEERS_HINT, SGLANG_ROUTER, VLLM_ROUTER, sglang_router, vllm_router
from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import RouterFlags, serve_command

__all__ = [
    "ENGINES",
    "MODEL",
    "STREAM_CHUNKS",
    "TARGETS",
    "WORKLOADS",
    "FleetCheck",
    "Launch",
    "Target",
    "Workload",
    "baseline_target",
]

MODEL = "sim-model"
ENGINES = 2
STREAM_CHUNKS = 20


@dataclass(frozen=True)
class Launch:
    """Where a router listens and what it routes to."""

    port: int
    metrics_port: int
    """A spare free port: the peers open a Prometheus listener (29000 for both by default),
    the endpoint picker its admin listener."""
    picker_port: int
    """Another: the endpoint picker's ext_proc port, which Envoy (on `port`) asks."""
    backends: tuple[str, ...]
    files: Path
    """Where a router's own files go (the tenants file): the run's log directory."""


@dataclass(frozen=True)
class FleetCheck:
    """Ready when `path` answers JSON holding one object per engine whose `key` is `value`."""

    path: str
    key: str
    value: object
    on_metrics_port: bool = False
    """Asked of `Launch.metrics_port` (the picker's admin port), not of the client port."""


@dataclass(frozen=True)
class Target:
    """One way to reach the engines: directly, or through a router that `command` starts."""

    name: str
    program: Path | None = None
    """The installed executable; absent means the target is skipped. None: no router."""
    command: Callable[[Launch], list[str]] | None = None
    fleet_check: FleetCheck | None = None
    """For routers that answer before every engine is registered."""
    peer: bool = False
    install_hint: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every request to the target, the load's and the checks'."""
    envoy_body_modes: tuple[str, str] | None = None
    """Set: clients reach it through Envoy (deploy/gateway/envoy.yaml with these request and
    response body modes) on the client port, and the router is its endpoint picker on
    `Launch.picker_port`; Envoy's CPU is counted apart."""


def _headcount(launch: Launch, program: tuple[str, ...] = (str(HEADCOUNT_BIN),)) -> list[str]:
    flags = RouterFlags(
        discovery=DiscoveryMode.STATIC,
        backends=launch.backends,
        routing=RoutingName.ROUND_ROBIN,
    )
    return serve_command(flags, host="127.0.0.1", port=launch.port, program=program)


TENANT_KEY = "sk-bench-overhead"
TENANTS_FILE = f"""\
# One unlimited tenant: flow control on (admission, accounting, the queue when saturated),
# no limit ever reached, so what it costs an unsaturated fleet is all that is measured.
[[tenant]]
name = "bench"
keys = ["{TENANT_KEY}"]
priority = 0
weight = 1
"""


def _headcount_picker(launch: Launch) -> list[str]:
    """headcount as Envoy's endpoint picker only: no OpenAI port of its own (`--port off`)."""
    return [
        *_headcount(launch),
        "--port=off",
        f"--ext-proc-port={launch.picker_port}",
        f"--admin-port={launch.metrics_port}",
    ]


def _headcount_tenants(launch: Launch) -> list[str]:
    path = launch.files / "tenants.toml"
    path.write_text(TENANTS_FILE)
    return [*_headcount(launch), f"--tenants-file={path}"]


def _headcount_keys(launch: Launch) -> list[str]:
    path = launch.files / "api-keys.txt"
    path.write_text(f"{TENANT_KEY}\n")
    return [*_headcount(launch), f"--api-keys-file={path}"]


_TENANT_KEY_HEADERS = (("Authorization", f"Bearer {TENANT_KEY}"),)


def baseline_target(rev: str, out_dir: Path) -> Target:
    """headcount as it was at git revision `rev`, measured beside today's in the same rounds."""
    commit, program = headcount_at(rev, out_dir)
    return Target(
        f"headcount@{commit}",
        program=Path(sys.executable),
        command=functools.partial(_headcount, program=program),
        fleet_check=FleetCheck("/engines", "state", "ready"),
    )


def _vllm_router(launch: Launch) -> list[str]:
    return vllm_router(launch.port, launch.metrics_port, launch.backends, "round_robin")


def _sglang_router(launch: Launch) -> list[str]:
    return sglang_router(launch.port, launch.metrics_port, launch.backends, "round_robin")


TARGETS: tuple[Target, ...] = (
    Target("direct"),
    Target(
        "headcount",
        program=HEADCOUNT_BIN,
        command=_headcount,
        fleet_check=FleetCheck("/engines", "state", "ready"),
        install_hint="run `make install`",
    ),
    Target(
        "headcount-keys",
        program=HEADCOUNT_BIN,
        command=_headcount_keys,
        fleet_check=FleetCheck("/engines", "state", "ready"),
        install_hint="run `make install`",
        headers=_TENANT_KEY_HEADERS,
    ),
    Target(
        "headcount-tenants",
        program=HEADCOUNT_BIN,
        command=_headcount_tenants,
        fleet_check=FleetCheck("/engines", "state", "ready"),
        install_hint="run `make install`",
        headers=_TENANT_KEY_HEADERS,
    ),
    Target(
        "envoy+picker",
        program=HEADCOUNT_BIN,
        command=_headcount_picker,
        fleet_check=FleetCheck("/engines", "state", "ready", on_metrics_port=True),
        install_hint="run `make install`",
        envoy_body_modes=BODY_MODES["full-duplex"],
    ),
    Target(
        "envoy+picker-buffered",
        program=HEADCOUNT_BIN,
        command=_headcount_picker,
        fleet_check=FleetCheck("/engines", "state", "ready", on_metrics_port=True),
        install_hint="run `make install`",
        envoy_body_modes=BODY_MODES["buffered"],
    ),
    Target(
        "vllm-router",
        program=VLLM_ROUTER,
        command=_vllm_router,
        peer=True,
        install_hint=PEERS_HINT,
    ),
    Target(
        "sglang-router",
        program=SGLANG_ROUTER,
        command=_sglang_router,
        fleet_check=FleetCheck("/workers", "is_healthy", True),
        peer=True,
        install_hint=PEERS_HINT,
    ),
)


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    connections: int
    stream: bool

    def body(self) -> bytes:
        return json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": STREAM_CHUNKS,
                "stream": self.stream,
            }
        ).encode()


WORKLOADS: tuple[Workload, ...] = (
    Workload("chat-c32", "chat, non-streaming, 32 connections", 32, stream=False),
    Workload("chat-c128", "chat, non-streaming, 128 connections", 128, stream=False),
    Workload("stream-c32", f"chat, streaming {STREAM_CHUNKS} chunks, 32 connections", 32, True),
)
