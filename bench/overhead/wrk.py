"""wrk, driven through `lua/openai.lua`, and the summary line that script prints, parsed."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common.harness import BenchError
from bench.common.processes import die_with_parent

__all__ = ["WRK_SCRIPT", "WrkResult", "run_wrk"]

WRK_SCRIPT = Path(__file__).resolve().parent / "lua" / "openai.lua"

_WRK_LINE = re.compile(r"^HC_WRK (\{.*\})$", re.MULTILINE)


@dataclass(frozen=True)
class WrkResult:
    """What one wrk run saw: completed responses, failures, latency percentiles."""

    duration_s: float
    requests: int
    """Complete responses, any status; a streamed response counts once, at its last chunk."""
    non_2xx: int
    """Responses with a status above 399 (wrk's `errors.status`)."""
    socket_errors: int
    """Connect, read and write errors and timeouts."""
    p50_ms: float
    p99_ms: float

    @property
    def ok_requests(self) -> int:
        return self.requests - self.non_2xx

    @property
    def ok_per_s(self) -> float:
        return self.ok_requests / self.duration_s


def run_wrk(
    url: str,
    body_file: Path,
    connections: int,
    threads: int,
    duration_s: int,
    split_addrs: list[str] | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> WrkResult:
    """Run wrk against `url` POSTing `body_file` with `headers`; with `split_addrs`, thread i
    goes to addr i."""
    env = dict(
        os.environ,
        HC_BODY_FILE=str(body_file),
        HC_SPLIT_ADDRS=",".join(split_addrs or []),
        HC_HEADERS="\n".join(f"{name}: {value}" for name, value in headers),
    )
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration_s}s",
        "--timeout",
        "10s",
        "-s",
        str(WRK_SCRIPT),
        url,
    ]
    try:
        done = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=duration_s + 30,
            preexec_fn=die_with_parent,
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"wrk did not finish within {duration_s + 30} s") from exc
    match = _WRK_LINE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise BenchError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    summary = json.loads(match.group(1))
    return WrkResult(
        duration_s=summary["duration_us"] / 1e6,
        requests=summary["requests"],
        non_2xx=summary["status"],
        socket_errors=sum(summary[kind] for kind in ("connect", "read", "write", "timeout")),
        p50_ms=summary["p50_us"] / 1e3,
        p99_ms=summary["p99_us"] / 1e3,
    )
