"""A simulated engine on stepped virtual time, so queueing is asserted to the exact second.

The engine sleeps on a `FakeClock(sleeps="step")`; the test moves time only
once everything has settled: every request holding a slot sleeps (waiting
for its next token or its prefill) and the clients have read every token
generated. So each stream's first token is stamped with the virtual time at
which the engine wrote it, and each step's `/metrics` is the state between
two instants of the engine's timing model. A request preempted by another
while it sleeps through its token would never let the engine settle (it
sleeps without holding a slot): a scenario for this harness preempts the
request that asks for the block, as the tests' do.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from headcount.sim.cluster.polling import wait_until
from headcount.sim.engine import SimEngine
from tests.support.clock import FakeClock

__all__ = ["SteppedEngine", "TimedStream"]


@dataclass
class TimedStream:
    """One streamed request as its client saw it, in the engine's virtual time."""

    tokens: int = 0
    first_token_at: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class SteppedEngine:
    """Streams sent to `engine` and time stepped from one settled state to the next."""

    def __init__(self, engine: SimEngine, clock: FakeClock, session: aiohttp.ClientSession) -> None:
        self.engine = engine
        self.clock = clock
        self.session = session
        self.streams: list[TimedStream] = []

    async def send(
        self, body: object, *, queued: int, path: str = "/v1/chat/completions"
    ) -> TimedStream:
        """Stream `body` from `path`; return once the engine holds `queued` requests (running
        or waiting), so requests reach it in the order sent."""
        stream = TimedStream()
        stream.task = asyncio.create_task(self._read(stream, f"{self.engine.url}{path}", body))
        self.streams.append(stream)
        await wait_until(
            lambda: self._held() == queued, what=f"{queued} requests running or waiting"
        )
        return stream

    async def step(self) -> dict[str, float] | None:
        """Wait until settled and return `/metrics` then; then move time to the next sleep's
        end. None once nothing sleeps (every request done or gone)."""
        values = await wait_until(self._settled, what="every request settled")
        assert isinstance(values, dict)
        if not self.clock.sleepers:
            return None
        self.clock.advance()
        return values

    async def metrics(self) -> dict[str, float]:
        async with self.session.get(f"{self.engine.url}/metrics") as response:
            text = await response.text()
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def _held(self) -> int:
        stats = self.engine.stats()
        running, waiting = stats["running"], stats["waiting"]
        assert isinstance(running, int) and isinstance(waiting, int)
        return running + waiting

    async def _settled(self) -> dict[str, float] | None:
        if self.engine.stats()["running"] != self.clock.sleepers:
            return None
        values = await self.metrics()
        generated = values["vllm:generation_tokens_total"]
        if generated != sum(stream.tokens for stream in self.streams):
            return None
        return values

    async def _read(self, stream: TimedStream, url: str, body: object) -> None:
        timeout = aiohttp.ClientTimeout(total=None)
        async with self.session.post(url, json=body, timeout=timeout) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    if stream.first_token_at is None:
                        stream.first_token_at = self.clock.now
                    stream.tokens += 1
