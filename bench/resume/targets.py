"""The routers compared: headcount with resume on and off, and vllm-router (which cuts).

headcount runs as the `headcount` console script beside this interpreter (the
venv's), which imports the `headcount` on `PYTHONPATH` first: the tree being
measured. It logs JSON (`--log-format json`) so its access log and resume lines
can be read back exactly; round robin, as vllm-router, so both spread the same
load the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common.harness import HEADCOUNT_BIN
from bench.common.peers import VLLM_ROUTER, vllm_router
from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import RouterFlags, serve_command

__all__ = ["HEADCOUNT", "TARGETS", "Target"]

HEADCOUNT = "headcount"
"""The target the checks are about."""


@dataclass(frozen=True)
class Target:
    """A router; `command(port, metrics_port, engine_urls)` starts it."""

    name: str
    program: Path
    command: Callable[[int, int, Sequence[str]], list[str]]
    setup: str
    """How it is configured, for the report."""
    peer: bool = False
    headcount: bool = False
    """Its metrics and JSON log are read (resumes, refusals, the seam histogram)."""
    resumes: bool = False
    """It resumes broken streams: each one it cuts should have a refusal's reason."""


def _headcount(resume_limit: int | None) -> Callable[[int, int, Sequence[str]], list[str]]:
    def command(port: int, _: int, urls: Sequence[str]) -> list[str]:
        flags = RouterFlags(
            discovery=DiscoveryMode.STATIC, backends=tuple(urls), routing=RoutingName.ROUND_ROBIN
        )
        argv = serve_command(flags, host="127.0.0.1", port=port, program=(str(HEADCOUNT_BIN),))
        argv.append("--log-format=json")
        if resume_limit is not None:
            argv.append(f"--stream-resume-limit={resume_limit}")
        return argv

    return command


def _vllm_router(port: int, metrics_port: int, urls: Sequence[str]) -> list[str]:
    return vllm_router(port, metrics_port, urls, "round_robin")


TARGETS: tuple[Target, ...] = (
    Target(
        HEADCOUNT,
        HEADCOUNT_BIN,
        _headcount(None),
        "`headcount serve --discovery static --routing round-robin --log-format json`, "
        "every other flag at its default (`--stream-resume-limit 2`)",
        headcount=True,
        resumes=True,
    ),
    Target(
        "headcount-no-resume",
        HEADCOUNT_BIN,
        _headcount(0),
        "the same with `--stream-resume-limit 0`: resume off, a stream broken mid-answer is cut",
        headcount=True,
    ),
    Target(
        "vllm-router",
        VLLM_ROUTER,
        _vllm_router,
        "`vllm-router --policy round_robin`, every other flag at its default",
        peer=True,
    ),
)
