"""An open-loop load generator: what a router's choices cost the client, and its own lag.

Every request is sent at its scheduled offset whether or not earlier ones have
finished (one asyncio task each, a connection pool without a limit), streamed,
and timed: time to first token is the arrival of the first chunk with content,
end-to-end is the end of the stream. Each answer's engine (the chunks'
`system_fingerprint`: the sim-engine's name) and its usage's prompt and
cached tokens are kept too, for the run's trace (`trace.py`). `lag_s` is
how late the generator itself sent each request (actual minus scheduled):
if its p99 is large, the generator, not the router, shaped the numbers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp

from bench.routing.workload import Arrival

__all__ = ["Outcome", "run_open_loop"]

_CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Outcome:
    """What one request saw; `error` is None when it streamed to its end with status 200."""

    arrival: Arrival
    lag_s: float
    ttft_s: float | None
    e2e_s: float | None
    output_tokens: int
    error: str | None
    engine: str | None = None
    """The answering engine's name (`system_fingerprint`)."""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    """Prompt tokens the engine found cached, as its usage reported them."""


async def _one(
    session: aiohttp.ClientSession, url: str, arrival: Arrival, start: float, deadline: float
) -> Outcome:
    sent = time.monotonic()
    lag = sent - (start + arrival.at_s)
    ttft: float | None = None
    tokens = 0
    engine: str | None = None
    prompt: int | None = None
    cached: int | None = None
    try:
        timeout = aiohttp.ClientTimeout(total=max(deadline - sent, 0.1))
        headers = {"Content-Type": "application/json"}
        async with session.post(url, data=arrival.body, headers=headers, timeout=timeout) as up:
            if up.status != 200:
                return Outcome(arrival, lag, None, None, 0, f"status {up.status}")
            async for line in up.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                engine = engine or chunk.get("system_fingerprint")
                choices = chunk.get("choices") or []
                if ttft is None and any((c.get("delta") or {}).get("content") for c in choices):
                    ttft = time.monotonic() - sent
                usage = chunk.get("usage")
                if usage:
                    tokens = int(usage.get("completion_tokens") or 0)
                    prompt = usage.get("prompt_tokens")
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        return Outcome(arrival, lag, ttft, None, tokens, type(error).__name__, engine)
    if ttft is None:
        return Outcome(arrival, lag, None, None, tokens, "no content", engine)
    e2e = time.monotonic() - sent
    return Outcome(arrival, lag, ttft, e2e, tokens, None, engine, prompt, cached)


async def run_open_loop(
    base_url: str,
    schedule: Sequence[Arrival],
    drain_s: float,
    marks: Sequence[tuple[float, Callable[[], Awaitable[None]]]] = (),
) -> list[Outcome]:
    """Send `schedule` on time to `base_url`; requests still open `drain_s` after the last fail.

    Each `(seconds, callback)` of `marks` awaits `callback` once, that many seconds into
    the run (the benchmark snapshots counters at the end of warm-up, and may inject a
    fault later).
    """
    url = base_url + _CHAT_PATH
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.monotonic()
        last = schedule[-1].at_s if schedule else 0.0
        deadline = start + last + drain_s
        tasks: list[asyncio.Task[Outcome]] = []
        pending = sorted(marks, key=lambda mark: mark[0])
        for arrival in schedule:
            while pending and arrival.at_s >= pending[0][0]:
                at_s, callback = pending.pop(0)
                await asyncio.sleep(max(start + at_s - time.monotonic(), 0))
                await callback()
            await asyncio.sleep(max(start + arrival.at_s - time.monotonic(), 0))
            tasks.append(asyncio.create_task(_one(session, url, arrival, start, deadline)))
        return list(await asyncio.gather(*tasks))
