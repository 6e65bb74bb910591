"""Steady, bounded chat traffic through a router, every request's outcome counted.

What a router promises its clients is judged by traffic that keeps flowing
while the cluster misbehaves: a request starts on every tick whether or not
the earlier ones have ended (a hang cannot slow the traffic down and hide),
and each ends as ok, failed or cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

__all__ = ["Traffic", "steady_traffic"]

_STREAM_END = b"data: [DONE]\n\n"


@dataclass
class Traffic:
    """What the traffic saw so far; `sent` counts requests started."""

    sent: int = 0
    ok: int = 0
    cut: int = 0
    """Answers begun and then broken off: an engine died in them and the router did not
    resume them."""
    failures: list[str] = field(default_factory=list)
    """Each request that got no answer or an error status, spelled out."""

    @property
    def failed(self) -> int:
        return len(self.failures)


@contextlib.asynccontextmanager
async def steady_traffic(
    router_url: str,
    model: str,
    *,
    every: float = 0.05,
    poisson: bool = False,
    stream_every: int = 0,
    max_tokens: int = 2,
    timeout: float = 3.0,
    max_requests: int = 400,
    max_seconds: float = 30.0,
) -> AsyncIterator[Traffic]:
    """A chat request to `model` every `every` seconds while in the block.

    With `poisson`, the gaps are random and `every` on average, as from many
    independent clients: an engine then sees idle moments even under load,
    which a fixed tick faster than an answer never leaves it. Every
    `stream_every`-th request streams (0: none does); a stream is ok only
    if it ends with `[DONE]`. Each request is bounded by `timeout`, the whole
    by `max_requests` and `max_seconds`. Leaving the block stops the ticks and
    waits for the requests still in flight.
    """
    traffic = Traffic()
    stop = asyncio.Event()
    deadline = time.monotonic() + max_seconds
    gaps = random.Random()

    async def send_one(session: aiohttp.ClientSession, number: int) -> None:
        stream = stream_every > 0 and number % stream_every == 0
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
        try:
            async with session.post(router_url + "/v1/chat/completions", json=body) as response:
                try:
                    payload = await response.read()
                except aiohttp.ClientPayloadError:
                    traffic.cut += 1
                    return
        except (aiohttp.ClientError, TimeoutError) as exc:
            traffic.failures.append(f"request {number}: {exc!r}")
            return
        if response.status == 200 and (not stream or payload.endswith(_STREAM_END)):
            traffic.ok += 1
        else:
            traffic.failures.append(f"request {number}: {response.status} {payload[:200]!r}")

    async def tick() -> None:
        client_timeout = aiohttp.ClientTimeout(total=timeout)
        async with aiohttp.ClientSession(timeout=client_timeout) as session:
            in_flight: set[asyncio.Task[None]] = set()
            while not stop.is_set() and traffic.sent < max_requests:
                if time.monotonic() > deadline:
                    break
                traffic.sent += 1
                request = asyncio.create_task(send_one(session, traffic.sent))
                in_flight.add(request)
                request.add_done_callback(in_flight.discard)
                gap = gaps.expovariate(1 / every) if poisson else every
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), gap)
            await asyncio.gather(*in_flight)

    task = asyncio.create_task(tick())
    try:
        yield traffic
    finally:
        stop.set()
        await task
