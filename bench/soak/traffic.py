"""Client traffic for the soak: open loop, streaming and not, some abandoned by the client.

Requests start at Poisson-distributed times whatever the earlier ones do (a
hang cannot slow the traffic down and hide). Each ends as one `Outcome`:

- `ok`: 200 and a whole answer (a stream ends with `data: [DONE]`);
- `aborted`: the client gave up on purpose (a stream closed after a few chunks, a
  request cancelled after a random delay): never a failure, it is load on the
  router's in-flight bookkeeping;
- `cut`: the answer began (its 200 head arrived) and then broke or stalled until the
  client's timeout: a router cannot fail over once it has relayed bytes;
- `failed`: anything else (an error status, no answer, a timeout before any byte).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass

import aiohttp

__all__ = ["Mix", "Outcome", "run_traffic"]

_DONE = b"data: [DONE]"


@dataclass(frozen=True)
class Mix:
    rate: float = 20.0
    """Requests per second, on average."""
    stream_share: float = 0.5
    abort_share: float = 0.1
    timeout_s: float = 30.0
    """Per request; a request on a hung engine that is never failed over ends here."""
    tokens: tuple[int, int] = (5, 40)


@dataclass(frozen=True)
class Outcome:
    number: int
    start: float
    end: float
    stream: bool
    kind: str
    detail: str = ""


@dataclass(frozen=True)
class _Plan:
    number: int
    stream: bool
    tokens: int
    abort_after_chunks: int | None
    abort_after_s: float | None


class _Request:
    """One request's progress, so a timeout can tell a cut answer from no answer."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.started = time.monotonic()
        self.status = 0

    def outcome(self, kind: str, detail: str = "") -> Outcome:
        plan = self.plan
        return Outcome(plan.number, self.started, time.monotonic(), plan.stream, kind, detail)

    def broken(self, detail: str) -> Outcome:
        """Cut once a 200 head was relayed (the router is committed to its engine), else failed."""
        return self.outcome("cut" if self.status == 200 else "failed", detail)


async def _send(session: aiohttp.ClientSession, url: str, model: str, request: _Request) -> Outcome:
    plan = request.plan
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"soak {plan.number}"}],
        "max_tokens": plan.tokens,
        "stream": plan.stream,
    }
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        request.status = response.status
        if response.status != 200:
            text = (await response.read())[:160].decode(errors="replace")
            return request.outcome("failed", f"{response.status} {text}")
        if not plan.stream:
            data = await response.read()
            if b'"choices"' in data:
                return request.outcome("ok")
            return request.outcome("failed", f"200 without choices: {data[:120]!r}")
        chunks = 0
        async for line in response.content:
            if line.startswith(_DONE):
                return request.outcome("ok")
            if line.startswith(b"data:"):
                chunks += 1
                if plan.abort_after_chunks is not None and chunks >= plan.abort_after_chunks:
                    response.close()
                    return request.outcome("aborted", f"after {chunks} chunks")
        return request.broken(f"stream ended after {chunks} chunks without [DONE]")


async def _one(
    session: aiohttp.ClientSession, url: str, model: str, plan: _Plan, timeout_s: float
) -> Outcome:
    request = _Request(plan)
    limit = timeout_s if plan.abort_after_s is None else min(timeout_s, plan.abort_after_s)
    try:
        return await asyncio.wait_for(_send(session, url, model, request), limit)
    except TimeoutError:
        if plan.abort_after_s is not None and limit < timeout_s:
            return request.outcome("aborted", f"cancelled after {limit:.2f} s")
        return request.broken(f"no whole answer within {timeout_s:g} s")
    except aiohttp.ClientPayloadError as exc:
        return request.broken(f"payload: {exc}")
    except (aiohttp.ClientError, OSError) as exc:
        return request.broken(f"{type(exc).__name__}: {exc}"[:200])


def _plan(rng: random.Random, number: int, mix: Mix) -> _Plan:
    stream = rng.random() < mix.stream_share
    abort = rng.random() < mix.abort_share
    return _Plan(
        number=number,
        stream=stream,
        tokens=rng.randint(*mix.tokens),
        abort_after_chunks=rng.randint(1, 4) if abort and stream else None,
        abort_after_s=rng.uniform(0.0, 0.3) if abort and not stream else None,
    )


async def run_traffic(
    url: str,
    model: str,
    mix: Mix,
    until: float,
    stop: asyncio.Event,
    seed: int,
    outcomes: list[Outcome],
) -> None:
    """Send until `until` or `stop`, then wait (bounded) for the requests in flight."""
    rng = random.Random(seed)
    max_requests = int(mix.rate * max(0.0, until - time.monotonic()) * 2) + 10
    in_flight: set[asyncio.Task[None]] = set()

    async def run(plan: _Plan) -> None:
        outcomes.append(await _one(session, url, model, plan, mix.timeout_s))

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        number = 0
        while not stop.is_set() and time.monotonic() < until and number < max_requests:
            number += 1
            task = asyncio.create_task(run(_plan(rng, number, mix)))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.expovariate(mix.rate))
        if in_flight:
            await asyncio.wait(in_flight, timeout=mix.timeout_s + 10)
        for task in in_flight:
            task.cancel()
