"""The overload suite's load: open-loop tenants, closed-loop floods, every answer recorded.

Open-loop tenants send at Poisson arrivals whatever the answers do; each
closed-loop worker sends its next request when its last one is answered, and
after a refusal waits what `Retry-After` says, at most `RETRY_CAP_S` (so a
limited tenant keeps asking often enough to take every token it is allowed).
Every request is streamed with its tenant's key; it is served (200 and the
stream to its `[DONE]`), refused (any other status, with its `Retry-After`), or
lost (no answer, a dropped connection, a stream cut short).

The measured window opens after the warm-up; with `Plan.steady`, not before that
tenant has had a whole minute of the router's limits store full and that minute
has ended. A sliding window of a minute starts with a minute's allowance, taken
at once, and a minute begun half-empty lets less than the limit through in the
next one; only after a full one is the rate exactly the limit. Every loop ends
by the window's end; requests still open `drain_s` later are lost.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from bench.overload.fleet import Engine, engines_waiting
from bench.overload.tenants import Sending, TenantLoad, request_body

__all__ = ["FULL_FLOOD", "Outcome", "Plan", "Traffic", "run_traffic"]

FULL_FLOOD = 3.0
"""The flood `TenantLoad.workers` is sized for, in multiples of the fleet's capacity."""
RETRY_CAP_S = 0.25
LIMIT_WINDOW_S = 60.0
"""The in-process limits store counts per whole minute of `time.monotonic()`, a clock every
process on the machine shares: the load generator knows where the router's minutes turn."""
FULL_MINUTE = 0.9
"""A minute in which the tenant got this share of its limit was full (its reservations,
estimated above its usage, keep it a little under)."""
STEADY_MAX_S = 135.0
"""Longest wait for `Plan.steady` (a minute filled, then its end: two turns at worst)."""
_SAMPLE_S = 0.5
_MAX_REQUESTS_PER_WORKER = 100_000
_CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Outcome:
    tenant: str
    sent_s: float
    """Seconds after the run's start."""
    status: int | None
    """None: lost."""
    ttft_s: float | None
    elapsed_s: float
    tokens: int
    """Prompt plus completion, as the answer's `usage` says (0 when not served)."""
    retry_after_s: float | None = None
    lost: str | None = None

    @property
    def served(self) -> bool:
        return self.status == 200 and self.lost is None


@dataclass(frozen=True)
class Plan:
    tenants: tuple[TenantLoad, ...]
    flood: float
    """Closed-loop workers are `TenantLoad.workers * flood / FULL_FLOOD`."""
    warmup_s: float
    phases_s: tuple[float, float]
    """The measured window's two parts; `late` tenants send only in the second."""
    drain_s: float
    steady: TenantLoad | None = None
    seed: int = 18

    def workers(self, tenant: TenantLoad) -> int:
        return max(1, round(tenant.workers * self.flood / FULL_FLOOD))


@dataclass
class Traffic:
    outcomes: list[Outcome] = field(default_factory=list)
    measured: tuple[float, float] = (0.0, 0.0)
    """The window, seconds after the start: requests sent in it are the measured ones."""
    late_s: float = 0.0
    """Where its second part begins, when `late` tenants start sending."""
    steady: bool | None = None
    """With `Plan.steady`: whether that tenant's limit was steady when the window opened."""
    waiting: list[int] = field(default_factory=list)
    """The engines' summed queue, sampled every 0.5 s in the window."""

    def window(self, tenant: str) -> list[Outcome]:
        low, high = self.measured
        return [o for o in self.outcomes if o.tenant == tenant and low <= o.sent_s < high]


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _content(chunk: dict[str, object]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    return any(isinstance(c, dict) and (c.get("delta") or {}).get("content") for c in choices)


class _Run:
    """One run's clock, its senders and what they saw."""

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, plan: Plan, engines: Sequence[Engine]
    ) -> None:
        self.session = session
        self.url = base_url + _CHAT_PATH
        self.plan = plan
        self.engines = engines
        self.start = time.monotonic()
        self.stop: float | None = None
        """Absolute; None until the warm-up is over."""
        self.late_from = 0.0
        self.window_open = asyncio.Event()
        self.traffic = Traffic()
        self.numbers = itertools.count()

    def over(self) -> bool:
        return self.stop is not None and time.monotonic() >= self.stop

    def _timeout_s(self) -> float:
        if self.stop is None:
            longest = STEADY_MAX_S + sum(self.plan.phases_s) + self.plan.drain_s
            return self.start + self.plan.warmup_s + longest - time.monotonic()
        return self.stop + self.plan.drain_s - time.monotonic()

    async def request(self, tenant: TenantLoad) -> Outcome:
        sent = time.monotonic()
        outcome = await self._exchange(tenant, sent)
        self.traffic.outcomes.append(outcome)
        return outcome

    async def _exchange(self, tenant: TenantLoad, sent: float) -> Outcome:
        at = sent - self.start
        headers = {"Authorization": f"Bearer {tenant.key}", "Content-Type": "application/json"}
        body = request_body(tenant, next(self.numbers))
        timeout = aiohttp.ClientTimeout(total=max(self._timeout_s(), 0.1))
        ttft: float | None = None
        tokens = 0
        done = False
        try:
            async with self.session.post(
                self.url, data=body, headers=headers, timeout=timeout
            ) as answer:
                if answer.status != 200:
                    await answer.read()
                    retry = _retry_after(answer.headers.get("Retry-After"))
                    took = time.monotonic() - sent
                    return Outcome(tenant.name, at, answer.status, None, took, 0, retry)
                async for line in answer.content:
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    elif line.startswith(b"data: {"):
                        chunk = json.loads(line[6:])
                        if ttft is None and _content(chunk):
                            ttft = time.monotonic() - sent
                        if usage := chunk.get("usage"):
                            tokens = int(usage.get("total_tokens") or 0)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            took = time.monotonic() - sent
            return Outcome(tenant.name, at, None, ttft, took, 0, lost=type(error).__name__)
        took = time.monotonic() - sent
        if not done or ttft is None:
            why = "stream cut before [DONE]" if not done else "no content"
            return Outcome(tenant.name, at, None, ttft, took, 0, lost=why)
        return Outcome(tenant.name, at, 200, ttft, took, tokens)

    async def _pause(self, seconds: float) -> None:
        if self.stop is not None:
            seconds = min(seconds, self.stop - time.monotonic())
        await asyncio.sleep(max(seconds, 0.0))

    async def closed_worker(self, tenant: TenantLoad) -> None:
        for _ in range(_MAX_REQUESTS_PER_WORKER):
            if self.over():
                return
            outcome = await self.request(tenant)
            if not outcome.served:
                await self._pause(min(outcome.retry_after_s or RETRY_CAP_S, RETRY_CAP_S))

    async def open_sender(self, tenant: TenantLoad) -> None:
        """Poisson arrivals from the start (a `late` tenant: from the window's second part)
        until the window ends; then waits for its requests."""
        started: list[asyncio.Task[Outcome]] = []
        rng = random.Random(f"{self.plan.seed}-{tenant.name}")
        if tenant.late:
            await self.window_open.wait()
            await asyncio.sleep(max(self.late_from - time.monotonic(), 0.0))
        due = time.monotonic()
        while not self.over() and len(started) < _MAX_REQUESTS_PER_WORKER:
            due += rng.expovariate(tenant.rate_rps)
            await asyncio.sleep(max(due - time.monotonic(), 0.0))
            if self.over():
                break
            started.append(asyncio.create_task(self.request(tenant)))
        await asyncio.gather(*started)

    async def sample(self) -> None:
        while not self.over():
            waiting = await engines_waiting(self.session, self.engines)
            if self.stop is not None and waiting is not None:
                self.traffic.waiting.append(waiting)
            await asyncio.sleep(_SAMPLE_S)

    def _steady_from(self, tenant: TenantLoad) -> float | None:
        """The first minute boundary (absolute) the tenant crossed with the minute before it
        full: from there on it gets exactly its limit a minute. None: not yet."""
        limit = tenant.tokens_per_minute
        now = time.monotonic()
        boundary = (self.start // LIMIT_WINDOW_S + 1) * LIMIT_WINDOW_S
        while boundary <= now:
            got = sum(
                o.tokens
                for o in self.traffic.outcomes
                if o.tenant == tenant.name
                and o.served
                and boundary - LIMIT_WINDOW_S <= self.start + o.sent_s < boundary
            )
            if got >= FULL_MINUTE * limit:
                return boundary
            boundary += LIMIT_WINDOW_S
        return None

    async def warm_up(self) -> None:
        await asyncio.sleep(self.plan.warmup_s)
        tenant = self.plan.steady
        if tenant is None:
            return
        for _ in range(int(STEADY_MAX_S / 0.1)):
            if self._steady_from(tenant) is not None:
                self.traffic.steady = True
                return
            if time.monotonic() - self.start > STEADY_MAX_S:
                self.traffic.steady = False
                return
            await asyncio.sleep(0.1)

    async def run(self) -> Traffic:
        senders = []
        for tenant in self.plan.tenants:
            if tenant.sending is Sending.CLOSED:
                for _ in range(self.plan.workers(tenant)):
                    senders.append(asyncio.create_task(self.closed_worker(tenant)))
            else:
                senders.append(asyncio.create_task(self.open_sender(tenant)))
        sampler = asyncio.create_task(self.sample())
        await self.warm_up()
        now = time.monotonic()
        first, second = self.plan.phases_s
        self.late_from, self.stop = now + first, now + first + second
        self.traffic.measured = (now - self.start, self.stop - self.start)
        self.traffic.late_s = self.late_from - self.start
        self.window_open.set()
        await asyncio.gather(*senders, sampler)
        return self.traffic


async def run_traffic(base_url: str, plan: Plan, engines: Sequence[Engine]) -> Traffic:
    """Send `plan` to the router at `base_url`; what every request saw, and the window."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        return await _Run(session, base_url, plan, engines).run()
