"""The `headcount serve` command line, built in one place from what the caller wants of it.

Tests, the demo and the benchmarks describe a router with `RouterFlags` (and
its `Timings`) and get the argument list from `serve_command`; a field left
at None (or False, or empty) leaves the router's own default in force. Each
field is named after its flag: `engine_port` is `--engine-port`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from headcount.config import DiscoveryMode, EngineScheme, RoutingName

__all__ = ["PYTHON_CLI", "RouterFlags", "Timings", "serve_command"]

PYTHON_CLI = (sys.executable, "-m", "headcount.cli")
"""`headcount` as this interpreter runs it, whether or not the console script is installed."""


@dataclass(frozen=True, kw_only=True)
class Timings:
    """Durations in seconds; small ones let a test watch the router recover within seconds."""

    probe_interval: float | None = None
    probe_timeout: float | None = None
    connect_timeout: float | None = None
    backoff_initial: float | None = None
    backoff_max: float | None = None
    api_request_timeout: float | None = None
    api_connect_timeout: float | None = None
    watch_idle_timeout: float | None = None
    discovery_stale_after: float | None = None
    discovery_dead_after: float | None = None
    drain_delay: float | None = None
    drain_timeout: float | None = None
    kv_events_idle_timeout: float | None = None
    kv_events_check_interval: float | None = None
    kv_events_replay_timeout: float | None = None
    limits_store_timeout: float | None = None


@dataclass(frozen=True, kw_only=True)
class RouterFlags:
    """Which engines a router finds and how, and how fast it reacts (`timings`)."""

    discovery: DiscoveryMode
    backends: tuple[str, ...] = ()
    kubeconfig: Path | None = None
    namespace: str | None = None
    label_selector: str | None = None
    inference_pool: str | None = None
    engine_port: int | None = None
    engine_scheme: EngineScheme | None = None
    routing: RoutingName | None = None
    grpc_health_port: int | None = None
    ready_requires_fresh: bool = False
    tokenizer: str | None = None
    resolve: tuple[str, ...] = ()
    """`NAME=ADDRESS` pairs: engine host names answered without a lookup."""
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    kv_placement: str | None = None
    """`on` or `off`; None: the router's default."""
    tenants_file: Path | None = None
    limits_store: str | None = None
    no_passthrough: bool = False
    engine_tls_ca_file: Path | None = None
    engine_tls_cert_file: Path | None = None
    engine_tls_key_file: Path | None = None
    engine_tls_server_name: str | None = None
    timings: Timings = field(default_factory=Timings)

    def argv(self) -> list[str]:
        """The flags, `--name=value` each; `timings` rendered after the rest."""
        return _render(self) + _render(self.timings)


def _render(description: RouterFlags | Timings) -> list[str]:
    flags: list[str] = []
    for each in dataclasses.fields(description):
        value = getattr(description, each.name)
        flag = "--" + each.name.replace("_", "-")
        if value is None or value is False or value == () or isinstance(value, Timings):
            continue
        if value is True:
            flags.append(flag)
        elif isinstance(value, tuple):
            flags.append(f"{flag}={','.join(value)}")
        elif isinstance(value, float):
            flags.append(f"{flag}={value:g}")
        else:
            flags.append(f"{flag}={value}")
    return flags


def serve_command(
    flags: RouterFlags, *, host: str, port: int, program: Sequence[str] = PYTHON_CLI
) -> list[str]:
    """`program serve` listening on `host`:`port` with `flags`, as an argument list."""
    return [*program, "serve", f"--host={host}", f"--port={port}", *flags.argv()]
