"""A stand-in for `headcount.kvindex.view.IndexView`, with its shape, for the surfaces' tests.

The surfaces read views through the `headcount.surfaces.kv_views.IndexStatus`
protocol; this double has every field the real view has, so a test that
type-checks against it also fits the real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from headcount.kvindex.stream import ClearReason
from headcount.kvindex.trust import IndexTrust

__all__ = ["FakeIndexView"]


@dataclass(frozen=True)
class FakeIndexView:
    trust: IndexTrust = IndexTrust.SYNCED
    reason: str = "events flowing"
    blocks: int = 0
    capacity: int | None = None
    block_size: int | None = None
    last_event_age: float | None = None
    events_applied: int = 0
    gaps: int = 0
    replays_filled: int = 0
    replays_failed: int = 0
    clears: Mapping[ClearReason, int] = field(default_factory=dict)
    predicted_hit_tokens: int = 0
    reported_hit_tokens: float | None = None
    unknown_parents: int = 0
    hints: int = 0
    memory_bytes: int = 0
    memory_limit_bytes: int = 256 << 20
    refused_blocks: int = 0
