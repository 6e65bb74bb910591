"""The Rust peer routers the overhead and routing suites compare against, and how to start them.

`bench/common/peers.sh` installs them (pinned wheels) in the git-ignored venv
`bench/.venv-peers`. Both get the same host, port, engines, policy and a spare
Prometheus port (each opens a listener, 29000 by default); what one suite adds
(vllm-router's KV-event sources) it appends.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.common.harness import BENCH

__all__ = [
    "PEERS_BIN",
    "PEERS_HINT",
    "SGLANG_ROUTER",
    "VLLM_ROUTER",
    "peer_versions",
    "sglang_router",
    "vllm_router",
]

PEERS_VENV = BENCH / ".venv-peers"
PEERS_BIN = PEERS_VENV / "bin"
VLLM_ROUTER = PEERS_BIN / "vllm-router"
SGLANG_ROUTER = PEERS_BIN / "sglang-router"
"""Installed with the sglang_router wheel; run through its `launch_router` module."""
PEERS_HINT = "run bench/common/peers.sh to install it"


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
