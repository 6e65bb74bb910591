"""The Rust peer routers the overhead and routing suites compare against, and how to start them.

`bench/common/peers.sh` installs them (pinned wheels) in the git-ignored venv
`bench/.venv-peers`. Both get the same host, port, engines, policy and a spare
Prometheus port (each opens a listener, 29000 by default); what one suite adds
(vllm-router's KV-event sources) it appends.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from bench.common.harness import BENCH, BenchError, say

__all__ = [
    "PEERS_BIN",
    "PEERS_HINT",
    "SGLANG_ROUTER",
    "VLLM_ROUTER",
    "peer_versions",
    "runnable_targets",
    "sglang_router",
    "vllm_router",
]

PEERS_VENV = BENCH / ".venv-peers"
PEERS_BIN = PEERS_VENV / "bin"
VLLM_ROUTER = PEERS_BIN / "vllm-router"
SGLANG_ROUTER = PEERS_BIN / "sglang-router"
"""Installed with the sglang_router wheel; run through its `launch_router` module."""
PEERS_HINT = "run bench/common/peers.sh to install it"


class _Target(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def program(self) -> Path: ...
    @property
    def peer(self) -> bool: ...


T = TypeVar("T", bound=_Target)


def runnable_targets(targets: Sequence[T], wanted: str, require_peers: bool) -> tuple[T, ...]:
    """The `targets` a comma list names, in its order; a peer not installed is skipped with a
    line (an error with `require_peers`), an unknown name or a missing program is an error."""
    by_name = {target.name: target for target in targets}
    names = [name.strip() for name in wanted.split(",") if name.strip()]
    if unknown := [name for name in names if name not in by_name]:
        raise BenchError(f"unknown targets {unknown}; choose from {', '.join(by_name)}")
    kept = []
    for target in (by_name[name] for name in names):
        if target.program.exists():
            kept.append(target)
        elif target.peer and not require_peers:
            say(f"skipping {target.name}: {target.program} not found ({PEERS_HINT})")
        else:
            raise BenchError(f"{target.name}: {target.program} not found")
    return tuple(kept)


def _flags(port: int, metrics_port: int, urls: Sequence[str], policy: str) -> list[str]:
    return [
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--worker-urls", *urls, "--policy", policy),
        *("--prometheus-port", str(metrics_port)),
    ]


def vllm_router(port: int, metrics_port: int, urls: Sequence[str], policy: str) -> list[str]:
    return [
        str(VLLM_ROUTER),
        *_flags(port, metrics_port, urls, policy),
        *("--worker-startup-timeout-secs", "30", "--log-level", "warning"),
    ]


def sglang_router(port: int, metrics_port: int, urls: Sequence[str], policy: str) -> list[str]:
    return [
        *(str(PEERS_BIN / "python"), "-m", "sglang_router.launch_router"),
        *_flags(port, metrics_port, urls, policy),
        *("--log-level", "warn"),
    ]


def peer_versions() -> str:
    """The installed peers and their versions, from the venv's package metadata."""
    found = sorted(PEERS_VENV.glob("lib/python*/site-packages/*_router-*.dist-info"))
    stems = (path.name.removesuffix(".dist-info").partition("-") for path in found)
    return ", ".join(f"{name.replace('_', '-')} {version}" for name, _, version in stems) or "none"
