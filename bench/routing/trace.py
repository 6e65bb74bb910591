"""A measured run as a trace: per request in arrival order, its blocks, where it went, what it hit.

The routers are black boxes, so the trace comes from the engines' answers,
which every router relays unchanged in the stream's body (headers they may
drop): each chunk's `system_fingerprint` is the sim-engine's `--name`, and the
closing usage gives `prompt_tokens` and `prompt_tokens_details.cached_tokens`,
the tokens that engine found cached at admission (`loadgen.py` keeps them per
request). The loadgen knows which arrival each answer belongs to, so no join
on the request's text is needed.

A request's blocks are computed here from its body exactly as the engine
computes them: the simulator's built-in tokenizer (`chat_prompt_ids`), then
vLLM's chained block hashes (`block_digests`), each hash interned as a small
int for the cache model (`cache_model.py`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from bench.routing.cache_model import Access
from bench.routing.loadgen import Outcome
from bench.routing.workload import Arrival
from headcount.sim.engine.block_hash import block_digests
from headcount.tokens import builtin_tokenizer
from headcount.tokens.requests import chat_prompt_ids

__all__ = ["RunTrace", "Schedule", "run_trace", "schedule_accesses"]


@dataclass(frozen=True)
class Schedule:
    """A run's requests as the cache model sees them, shared by every target that ran it."""

    arrivals: tuple[Arrival, ...]
    accesses: tuple[Access, ...]
    prompt_tokens: tuple[int, ...]
    measured: tuple[bool, ...]
    """Sent in the measured window (after the warm-up)."""


def schedule_accesses(
    arrivals: Sequence[Arrival], warmup_s: float, block_size: int, max_tokens: int
) -> Schedule:
    tokenizer = builtin_tokenizer()
    ids: dict[bytes, int] = {}
    accesses, prompt_tokens = [], []
    for arrival in arrivals:
        prompt = chat_prompt_ids(json.loads(arrival.body), tokenizer)
        blocks = tuple(
            ids.setdefault(digest, len(ids)) for digest in block_digests(prompt, block_size, None)
        )
        size = len(prompt)
        # Every block it held beyond its prompt's full ones, the last partly filled one too.
        output = -(-(size + max_tokens - 1) // block_size) - size // block_size
        accesses.append(Access(blocks, (size - 1) // block_size, output))
        prompt_tokens.append(size)
    return Schedule(
        tuple(arrivals),
        tuple(accesses),
        tuple(prompt_tokens),
        tuple(arrival.at_s >= warmup_s for arrival in arrivals),
    )


@dataclass(frozen=True)
class RunTrace:
    """One target's run of a schedule: per request, the engine it went to and what it hit."""

    schedule: Schedule
    engines: tuple[int | None, ...]
    """Index of the engine that answered; None when the request failed."""
    cached_tokens: tuple[int | None, ...]
    """What that engine found cached at admission, as its usage reported it."""
    mismatches: int
    """Answered requests whose reported prompt tokens differ from the trace's count."""


def run_trace(schedule: Schedule, outcomes: Sequence[Outcome], names: Sequence[str]) -> RunTrace:
    """The trace of `outcomes` (in `schedule`'s order); `names` are the engines' `--name`s."""
    index = {name: position for position, name in enumerate(names)}
    engines: list[int | None] = []
    cached: list[int | None] = []
    mismatches = 0
    for outcome, tokens in zip(outcomes, schedule.prompt_tokens, strict=True):
        served = outcome.error is None and outcome.engine in index
        engines.append(index[outcome.engine] if served and outcome.engine else None)
        cached.append(outcome.cached_tokens if served else None)
        if served and outcome.prompt_tokens != tokens:
            mismatches += 1
    return RunTrace(schedule, tuple(engines), tuple(cached), mismatches)
