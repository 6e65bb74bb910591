"""The crashes: a seeded schedule of engine kills, and running it against a `Fleet`.

The schedule is computed before the run from the seed alone (`schedule`), so
every router meets the same crashes at the same moments of its run: the
engines round robin, one every `period_s` from `period_s / 2` until
`duration_s`, each down for a seeded time shorter than the period (a pod's
restart), so the fleet never lacks more than one engine. Running it
(`run_chaos`) is bounded by the schedule: it ends with the last engine back.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from bench.common.harness import BenchError
from bench.resume.fleet import Fleet

__all__ = ["Crash", "Kill", "run_chaos", "schedule"]

_MARGIN_S = 1.5
"""Kept between an engine's restart and the next kill, for it to start."""


@dataclass(frozen=True)
class Kill:
    """One planned crash: `at` seconds into the run, engine `engine`, down for `down_s`."""

    at: float
    engine: int
    down_s: float


@dataclass(frozen=True)
class Crash:
    """One crash as it happened (`time.monotonic()`); `url` names the engine."""

    engine: int
    url: str
    killed: float
    restarted: float
    """When the new process answered."""


def schedule(
    seed: int, duration_s: float, period_s: float, down_s: tuple[float, float], engines: int
) -> list[Kill]:
    """The crashes of a run: see the module docstring. The first engine is the seed's."""
    low, high = down_s
    if not 0 < low <= high or high + _MARGIN_S > period_s:
        raise BenchError(f"down time {low:g}-{high:g} s does not fit a period of {period_s:g} s")
    rng = random.Random(seed)
    first = rng.randrange(engines)
    kills: list[Kill] = []
    at = period_s / 2
    while at < duration_s:
        kills.append(Kill(at, (first + len(kills)) % engines, round(rng.uniform(low, high), 3)))
        at += period_s
    return kills


async def run_chaos(fleet: Fleet, kills: list[Kill], t0: float, crashes: list[Crash]) -> None:
    """Crash and restart engines as `kills` says, `t0` the run's start (monotonic); each crash
    is appended to `crashes` once its engine is back."""
    for kill in kills:
        await asyncio.sleep(max(0.0, t0 + kill.at - time.monotonic()))
        engine = fleet.engines[kill.engine]
        killed = await fleet.kill(engine)
        await asyncio.sleep(max(0.0, killed + kill.down_s - time.monotonic()))
        await fleet.start(engine)
        crashes.append(Crash(kill.engine, engine.url, killed, time.monotonic()))
