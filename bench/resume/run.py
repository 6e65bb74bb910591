"""One router's run: a fresh fleet, the router, the load and the crashes together, then what
the router says (its metrics before it stops, its log after). Every stream is kept in the
log directory (`streams-<router>.json`, times monotonic) for a second look.

The method: bench/resume/__init__.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop

from bench.common.harness import BenchError, say
from bench.common.processes import Proc, Processes
from bench.resume.chaos import Crash, Kill, run_chaos
from bench.resume.fleet import Fleet
from bench.resume.measure import Tally, tally
from bench.resume.signals import SEAM, Histogram, histogram, parse_log, resume_counts
from bench.resume.targets import Target
from bench.resume.traffic import MODEL, Load, Stream, request_body, run_load
from headcount.sim.cluster import RouterClient, wait_until
from headcount.sim.loopback import free_port

__all__ = ["Measured", "Settings", "measure"]

_READY_TIMEOUT_S = 60.0
_DRAIN_S = 10.0
"""Past the load's end, on top of a request's timeout, before the run is abandoned."""


@dataclass(frozen=True)
class Settings:
    duration_s: float
    kills: list[Kill]
    load: Load
    token_delay: float
    hosts: list[str]
    port: int
    log_dir: Path


@dataclass
class Measured:
    target: Target
    tally: Tally
    crashes: list[Crash]
    resumes: Counter[str] | None = None
    """The router's resume counter by outcome (headcount only)."""
    seam_histogram: Histogram | None = None
    t0: float = 0.0
    """When the load began (monotonic): the report's times are after it."""
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)


async def _chat_ok(url: str) -> bool:
    """One short stream through the router ends with `[DONE]`."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        body = request_body("Are you there", 4)
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            return response.status == 200 and b"data: [DONE]" in await response.read()


async def _engines_ready(url: str, count: int) -> bool:
    engines = await RouterClient(url, timeout=5.0).engines()
    return sum(1 for engine in engines if engine.get("state") == "ready") >= count


async def _wait_ready(target: Target, router: Proc, url: str, engines: int) -> None:
    async def ready() -> bool:
        if not router.alive():
            raise BenchError(f"{target.name} exited:\n{router.log_tail()}")
        if not await _chat_ok(url):
            return False
        return not target.headcount or await _engines_ready(url, engines)

    try:
        await wait_until(ready, timeout=_READY_TIMEOUT_S, interval=0.2, what=target.name)
    except TimeoutError as exc:
        raise BenchError(f"{target.name} not ready: {exc}\n{router.log_tail()}") from None
    # Every engine answers through it (round robin: consecutive requests go to each).
    for _ in range(2 * engines):
        if not await _chat_ok(url):
            raise BenchError(f"{target.name}: a request failed on a healthy fleet")


async def _metrics(url: str) -> str | None:
    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
        return await RouterClient(url, timeout=5.0).metrics()
    return None


async def _run(target: Target, procs: Processes, settings: Settings) -> Measured:
    fleet = Fleet(procs, target.name, settings.hosts, settings.port, settings.token_delay, MODEL)
    await fleet.start_all()
    port, metrics_port = free_port(), free_port()
    router = procs.start(target.name, target.command(port, metrics_port, fleet.urls), port=port)
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_ready(target, router, url, len(fleet.engines))
        load = settings.load
        stream_s = load.max_tokens * settings.token_delay
        max_requests = int(settings.duration_s / stream_s) * 2 + 10
        streams: list[Stream] = []
        crashes: list[Crash] = []
        wall_offset = time.time() - time.monotonic()
        t0 = time.monotonic()
        say(f"{target.name}: {settings.duration_s:g} s of load, {len(settings.kills)} crashes")
        async with asyncio.timeout(settings.duration_s + load.timeout_s + _DRAIN_S + 60):
            await asyncio.gather(
                run_load(url, load, t0 + settings.duration_s, max_requests, streams),
                run_chaos(fleet, settings.kills, t0, crashes),
            )
        elapsed = time.monotonic() - t0
        text = await _metrics(url) if target.headcount else None
    finally:
        await asyncio.to_thread(procs.stop, router)
        await fleet.stop_all()
    log = parse_log(router.log_path.read_text(errors="replace")) if target.headcount else None
    streams_file = settings.log_dir / f"streams-{target.name}.json"
    kept = {
        "t0": t0,
        "crashes": [dataclasses.asdict(crash) for crash in crashes],
        "streams": [dataclasses.asdict(stream) for stream in streams],
    }
    streams_file.write_text(json.dumps(kept))
    measured = Measured(
        target,
        tally(streams, crashes, log, load.max_tokens, wall_offset),
        crashes,
        t0=t0,
        elapsed_s=elapsed,
    )
    if target.headcount:
        if text is None:
            measured.notes.append("its /metrics did not answer after the run")
        else:
            measured.resumes = resume_counts(text)
            measured.seam_histogram = histogram(text, SEAM)
    return measured


def measure(target: Target, procs: Processes, settings: Settings) -> Measured:
    """Run `target` through the load and the crashes (a blocking call: its own event loop,
    uvloop's, so the client's own overhead stays small beside the gaps it measures)."""
    return uvloop.run(_run(target, procs, settings))
