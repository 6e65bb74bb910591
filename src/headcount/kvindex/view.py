"""One engine's cache index as `/engines`, `/health` and `/metrics` show it: a frozen snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from headcount.kvindex.stream import ClearReason
from headcount.kvindex.trust import IndexTrust

__all__ = ["IndexView"]


@dataclass(frozen=True, slots=True)
class IndexView:
    trust: IndexTrust
    reason: str
    """Why it is in that state, in words for people."""
    blocks: int
    hints: int
    """Blocks kept as hints after a gap the replay could not fill (not in `blocks`)."""
    memory_bytes: int
    """What the index is charged: its blocks, hints and what it has yet to free."""
    memory_limit_bytes: int
    """Its share of the memory bounds: past it, stored blocks are refused."""
    refused_blocks: int
    """Stored blocks not indexed for the memory bound."""
    capacity: int | None
    """The engine's advertised `num_gpu_blocks`, None until scraped."""
    block_size: int | None
    last_event_age: float | None
    """Seconds since the last batch; None before the first."""
    events_applied: int
    gaps: int
    replays_filled: int
    replays_failed: int
    clears: Mapping[ClearReason, int]
    predicted_hit_tokens: int
    """Prompt tokens predicted cached, summed over the requests routed to the engine."""
    reported_hit_tokens: float | None
    """The engine's own `vllm:prefix_cache_hits_total`, None until scraped."""
    unknown_parents: int
    """Stored events whose parent block the index did not know (missed events)."""
