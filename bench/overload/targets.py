"""What the overload suite measures: headcount without and with flow control, vllm-router
with its limiter, and the fleet with no flood at all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common.harness import HEADCOUNT_BIN
from bench.common.peers import VLLM_ROUTER, vllm_router
from bench.overload.fleet import SLOTS, Engine
from bench.overload.tenants import tenants_toml
from headcount.config import DiscoveryMode
from headcount.sim.cluster import RouterFlags, serve_command

__all__ = ["FLEET_ALONE", "TARGETS", "VLLM_QUEUE_TIMEOUT_S", "Target"]

VLLM_QUEUE_TIMEOUT_S = 30
"""As headcount's default `--queue-timeout`."""


@dataclass(frozen=True)
class Target:
    """A router to measure; `command(port, metrics_port, engines, files)` starts it (`files`:
    a directory for what it reads, the tenants file)."""

    name: str
    program: Path
    command: Callable[[int, int, Sequence[Engine], Path], list[str]]
    setup: str
    """How it is configured, for the report."""
    peer: bool = False
    alone: bool = False
    """Only the interactive tenant sends: its TTFT on a fleet with room."""
    limits: bool = False
    """Holds `capped` to its tokens per minute: the main run waits until that is steady."""


def _headcount(port: int, _: int, engines: Sequence[Engine], __: Path) -> list[str]:
    flags = RouterFlags(discovery=DiscoveryMode.STATIC, backends=tuple(e.url for e in engines))
    return serve_command(flags, host="127.0.0.1", port=port, program=(str(HEADCOUNT_BIN),))


def _headcount_flow(port: int, metrics: int, engines: Sequence[Engine], files: Path) -> list[str]:
    path = files / "tenants.toml"
    path.write_text(tenants_toml())
    return [*_headcount(port, metrics, engines, files), f"--tenants-file={path}"]


_VLLM_LIMITER = (
    *("--max-concurrent-requests", str(SLOTS), "--queue-size", "1000"),
    *("--queue-timeout-secs", str(VLLM_QUEUE_TIMEOUT_S), "--rate-limit-tokens-per-second", "1"),
)


def _vllm_router(port: int, metrics: int, engines: Sequence[Engine], _: Path) -> list[str]:
    return [*vllm_router(port, metrics, [e.url for e in engines], "round_robin"), *_VLLM_LIMITER]


FLEET_ALONE = Target(
    "fleet-alone",
    HEADCOUNT_BIN,
    _headcount,
    "headcount, no tenants file, only the interactive tenant sending: its unloaded TTFT",
    alone=True,
)
TARGETS: tuple[Target, ...] = (
    FLEET_ALONE,
    Target(
        "headcount",
        HEADCOUNT_BIN,
        _headcount,
        "no tenants file (before issue 18: every request sent on at once, the excess waits "
        "in the engines' queues)",
    ),
    Target(
        "headcount-flow",
        HEADCOUNT_BIN,
        _headcount_flow,
        "`--tenants-file` (bench/overload/tenants.py), every other flow flag at its default",
        limits=True,
    ),
    Target(
        "vllm-router",
        VLLM_ROUTER,
        _vllm_router,
        "round_robin, its limiter: `" + " ".join(_VLLM_LIMITER) + "`: one token bucket and one "
        "FIFO queue for all clients (no keys, priorities, weights or token limits); a request "
        "takes a token and gives it back when answered, the refill adds more, so under a "
        "sustained flood more than 16 get through; one queued longer than the refill takes to "
        "make its token (1 s) is answered 408",
        peer=True,
    ),
)
