"""The fleet's prefix caches replayed offline, block by block: what a trace's routing would hit.

A trace is the run's requests in arrival order, each an `Access`: its prompt's
full blocks (ids standing for vLLM's chained block hashes, so two requests
share a block only if they share everything before it), how many of them can
hit, and how many other blocks it held.

- `lru_hits`: one engine as the simulator's block pool keeps it
  (src/headcount/sim/engine/block_pool.py). A request hits the longest run of
  its leading blocks that is cached, at most `limit` (vLLM recomputes the last
  prompt token). Its blocks are then all cached and, as a request frees its
  blocks tail first when it ends, they join the eviction queue from its last
  block to its first, so its first block is the last of them to go; the
  blocks it held beyond its prompt's full ones (`output_blocks`) queue too,
  cached or not, and go first. Beyond `capacity` blocks, the head of the
  queue (least recently freed) is evicted. Run one request at a time, the
  simulator hits exactly this (tests/unit/test_bench_routing_trace.py).
  The one simplification: a request's blocks are taken and freed at its
  arrival, where the engine frees them when it ends, a second or so later,
  and meanwhile admits other requests.
- `fleet_hits`: every engine an `lru_hits` cache, each request replayed on
  the engine it went to.
- `belady_hits`: one cache and clairvoyant eviction (Belady: evict the block
  whose next use is furthest, the deeper block of a chain first on a tie, a
  block never used again at once, including the one just used). A block's
  next use is never before its parent's, so the cache stays a union of
  prefixes and every cached block of a request's chain counts as a hit: for a
  cache of that size it is the most hits any eviction order gets on the trace.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Container, Sequence
from dataclasses import dataclass

__all__ = ["Access", "belady_hits", "fleet_hits", "lru_hits"]


@dataclass(frozen=True)
class Access:
    """One request as a cache sees it."""

    blocks: tuple[int, ...]
    """Its prompt's full blocks, first to last; equal ids are equal chains."""
    limit: int
    """How many of its leading blocks may hit: (prompt tokens - 1) // block size."""
    output_blocks: int = 0
    """The other blocks it held (its output's, and a partly filled last one): they queue for
    eviction as the cached ones do, and are never asked for again."""


def _leading_hits(access: Access, cached: Container[int]) -> int:
    hits = 0
    for block in access.blocks[: access.limit]:
        if block not in cached:
            break
        hits += 1
    return hits


def lru_hits(accesses: Sequence[Access], capacity: int) -> list[int]:
    """Per access, how many of its blocks hit one engine's LRU cache of `capacity` blocks."""
    queue: OrderedDict[int, None] = OrderedDict()
    fresh = -1
    hits = []
    for access in accesses:
        hits.append(_leading_hits(access, queue))
        for _ in range(access.output_blocks):
            queue[fresh] = None
            fresh -= 1
        for block in reversed(access.blocks):
            queue[block] = None
            queue.move_to_end(block)
        while len(queue) > capacity:
            queue.popitem(last=False)
    return hits


def fleet_hits(accesses: Sequence[Access], engines: Sequence[int], capacity: int) -> list[int]:
    """Per access, its hit blocks on engine `engines[i]`'s LRU cache (see `lru_hits`)."""
    by_engine: dict[int, list[int]] = {}
    for index, engine in enumerate(engines):
        by_engine.setdefault(engine, []).append(index)
    hits = [0] * len(accesses)
    for indices in by_engine.values():
        for index, hit in zip(
            indices, lru_hits([accesses[i] for i in indices], capacity), strict=True
        ):
            hits[index] = hit
    return hits


def _next_uses(accesses: Sequence[Access]) -> list[list[float]]:
    """Per access and block, the index of the next access asking for it (inf: none)."""
    later: dict[int, float] = {}
    uses: list[list[float]] = [[] for _ in accesses]
    for index in range(len(accesses) - 1, -1, -1):
        blocks = accesses[index].blocks
        uses[index] = [later.get(block, math.inf) for block in blocks]
        for block in blocks:
            later[block] = index
    return uses


def belady_hits(accesses: Sequence[Access], capacity: int) -> list[int]:
    """Per access, its hit blocks in one cache of `capacity` blocks with Belady's eviction."""
    next_use = _next_uses(accesses)
    cached: dict[int, float] = {}
    """Each cached block's next use."""
    heap: list[tuple[float, int, int]] = []
    """(-next use, -depth, block); entries whose next use has changed are stale."""
    hits = []
    for index, access in enumerate(accesses):
        hits.append(_leading_hits(access, cached))
        for depth, (block, use) in enumerate(zip(access.blocks, next_use[index], strict=True)):
            if use == math.inf:
                cached.pop(block, None)
                continue
            cached[block] = use
            heapq.heappush(heap, (-use, -depth, block))
        while len(cached) > capacity:
            use, _, block = heapq.heappop(heap)
            if cached.get(block) == -use:
                del cached[block]
    return hits
