"""Each run's hits beside what the cache model says was possible, and why the rest missed.

Per schedule (a workload's requests at one rate and seed, the same for every
target): the pooled bound (`cache_model.belady_hits` over one cache of the
fleet's `ENGINES x MODEL_CAPACITY` blocks), the same pooled cache under LRU
(no bound: it tells what the bound owes to clairvoyance and what to pooling)
and the best fixed assignment (`assignment.best_fixed_assignment`).
Per target's trace of it: its hit rate as its engines reported it per
request, the cache model's replay of the same routing
(`cache_model.fleet_hits`: how well the model predicts the engines, the
check that the bounds mean something), and its misses split into
compulsory, capacity and routing (`misses.breakdown`). Rates are hit tokens
over the prompt tokens of the measured requests.

`MODEL_CAPACITY`, each engine's cache in the model: its usable blocks (vLLM's
null block aside). The blocks running requests hold are out of the engine's
eviction queue but in its pool; in the model they are the most recently
used, which LRU would not evict either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.routing.assignment import Placement, best_fixed_assignment
from bench.routing.cache_model import belady_hits, fleet_hits, lru_hits
from bench.routing.fleet import BLOCK_SIZE, ENGINES, KV_BLOCKS
from bench.routing.misses import Breakdown, breakdown
from bench.routing.trace import RunTrace, Schedule

__all__ = ["MODEL_CAPACITY", "ScheduleBounds", "TraceCheck", "check_trace", "schedule_bounds"]

MODEL_CAPACITY = KV_BLOCKS - 1


@dataclass(frozen=True)
class ScheduleBounds:
    pooled: list[int]
    """Per request, its hit blocks in the pooled bound."""
    pooled_rate: float
    pooled_lru_rate: float
    """The same pooled cache with LRU eviction: what clairvoyance adds to the pooled bound."""
    fixed: Placement
    fixed_rate: float


@dataclass(frozen=True)
class TraceCheck:
    measured_rate: float | None
    """The engines' own per-request `cached_tokens`, over the answered measured requests."""
    model_rate: float | None
    """The cache model's replay of the same routing, over the same requests."""
    misses: Breakdown
    failed: int
    """Measured requests with no answer: left out of the rates and the replay."""


def _measured_tokens(schedule: Schedule) -> int:
    return sum(t for t, m in zip(schedule.prompt_tokens, schedule.measured, strict=True) if m)


def schedule_bounds(
    schedule: Schedule, tenants: Sequence[int], conversations: Sequence[int], seed: int
) -> ScheduleBounds:
    queried = _measured_tokens(schedule) or 1
    pooled = belady_hits(schedule.accesses, ENGINES * MODEL_CAPACITY)
    pooled_lru = lru_hits(schedule.accesses, ENGINES * MODEL_CAPACITY)
    fixed = best_fixed_assignment(
        schedule.accesses,
        schedule.measured,
        tenants,
        conversations,
        ENGINES,
        MODEL_CAPACITY,
        seed=seed,
    )
    return ScheduleBounds(
        pooled,
        _measured_hits(schedule, pooled) / queried,
        _measured_hits(schedule, pooled_lru) / queried,
        fixed,
        fixed.hit_blocks * BLOCK_SIZE / queried,
    )


def _measured_hits(schedule: Schedule, hits: Sequence[int]) -> int:
    """Hit tokens over the measured requests, from hit blocks per request."""
    return sum(h * BLOCK_SIZE for h, m in zip(hits, schedule.measured, strict=True) if m)


def check_trace(trace: RunTrace, bounds: ScheduleBounds) -> TraceCheck:
    schedule = trace.schedule
    served = [i for i, engine in enumerate(trace.engines) if engine is not None]
    model = fleet_hits(
        [schedule.accesses[i] for i in served],
        [trace.engines[i] or 0 for i in served],
        MODEL_CAPACITY,
    )
    counted = [k for k, i in enumerate(served) if schedule.measured[i]]
    queried = sum(schedule.prompt_tokens[served[k]] for k in counted)
    measured = sum(trace.cached_tokens[served[k]] or 0 for k in counted)
    predicted = sum(model[k] * BLOCK_SIZE for k in counted)
    failed = sum(schedule.measured) - len(counted)
    return TraceCheck(
        measured / queried if queried else None,
        predicted / queried if queried else None,
        breakdown(trace, bounds.pooled, BLOCK_SIZE),
        failed,
    )
