"""Why a router's requests missed the cache: compulsory, capacity or routing misses, in tokens.

Over the measured requests a router's engines answered, each request's prompt
tokens are either a hit (the `cached_tokens` its engine reported) or a miss
of exactly one kind:

- compulsory: tokens that no cache could have held: those past the request's
  last cacheable block (its partial last block, and the last token, which
  vLLM always recomputes), and every block that no earlier request of the run
  (warm-up included, on any engine) had asked for;
- capacity: blocks asked for before, but missed by the pooled bound too (one
  cache of the whole fleet's blocks with Belady's eviction, `belady_hits`,
  over the same arrivals): no routing could have kept them with that much
  memory;
- routing: the rest, blocks the pooled bound hit but the engine the router
  chose did not have: the price of where the router sent the request (and
  of splitting the fleet's memory into engines).

A request's hits are the leading run of its blocks, so with h its engine's
hit blocks, p the pooled bound's, s how many of its leading blocks were asked
for before and L its cacheable blocks, blocks [max(h, s), L) are compulsory,
[max(h, p), min(s, L)) capacity and [h, min(p, s, L)) routing: the three
ranges split [h, L) exactly, so hits + the three = prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.routing.cache_model import Access
from bench.routing.trace import RunTrace

__all__ = ["Breakdown", "breakdown", "seen_before"]


@dataclass(frozen=True)
class Breakdown:
    """Prompt tokens of the measured requests, split into hits and the three kinds of miss."""

    queried: int
    hits: int
    compulsory: int
    capacity: int
    routing: int

    def share(self, tokens: int) -> float:
        return tokens / self.queried if self.queried else 0.0


def seen_before(accesses: Sequence[Access]) -> list[int]:
    """Per access, how many of its leading blocks an earlier access had asked for."""
    seen: set[int] = set()
    counts = []
    for access in accesses:
        count = 0
        for block in access.blocks:
            if block not in seen:
                break
            count += 1
        counts.append(count)
        seen.update(access.blocks)
    return counts


def breakdown(trace: RunTrace, pooled: Sequence[int], block_size: int) -> Breakdown:
    """`pooled`: per request of the trace's schedule, its hit blocks in the pooled bound."""
    schedule = trace.schedule
    seen = seen_before(schedule.accesses)
    queried = hits = compulsory = capacity = routing = 0
    for index, access in enumerate(schedule.accesses):
        cached = trace.cached_tokens[index]
        if not schedule.measured[index] or cached is None:
            continue
        size = schedule.prompt_tokens[index]
        h, p, s, limit = cached // block_size, pooled[index], seen[index], access.limit
        queried += size
        hits += cached
        compulsory += size - limit * block_size + max(0, limit - max(h, s)) * block_size
        capacity += max(0, min(s, limit) - max(h, p)) * block_size
        routing += max(0, min(p, s, limit) - h) * block_size
    return Breakdown(queried, hits, compulsory, capacity, routing)
