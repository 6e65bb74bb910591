"""What the router's surfaces read of each engine's cache index, and nothing more.

`/engines`, `/health` and `/metrics` show the `kv-aware` indexes' trust and
counts. They take `KvViews`, a callable returning the registry's views by
engine id (`headcount.kvindex.registry.KvIndexes.views`), or None when routing
is not `kv-aware`: then nothing about KV indexes is computed or shown. The
`IndexStatus` protocol is the part of `headcount.kvindex.view.IndexView` they
read, so they depend on its shape, not on the index.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from headcount.kvindex.stream import ClearReason
from headcount.kvindex.trust import IndexTrust

__all__ = ["IndexStatus", "KvViews"]


class IndexStatus(Protocol):
    """One engine's index as the surfaces see it (an `IndexView`)."""

    @property
    def trust(self) -> IndexTrust: ...
    @property
    def reason(self) -> str:
        """Why it is in that state, for people ("not confirmed for 12s: ...", "replay failed")."""

    @property
    def blocks(self) -> int: ...
    @property
    def hints(self) -> int:
        """Blocks kept as hints after a gap the replay could not fill (not in `blocks`)."""

    @property
    def memory_bytes(self) -> int:
        """What the index is charged against its memory bound: blocks, hints, not yet freed."""

    @property
    def memory_limit_bytes(self) -> int:
        """The index's share of `--kv-index-max-bytes` (and at most the per-engine bound)."""

    @property
    def refused_blocks(self) -> int:
        """Stored blocks not indexed because the index was at its memory bound."""

    @property
    def capacity(self) -> int | None: ...
    @property
    def last_event_age(self) -> float | None:
        """Seconds since the engine's last event; None before the first."""

    @property
    def events_applied(self) -> int: ...
    @property
    def gaps(self) -> int: ...
    @property
    def replays_filled(self) -> int: ...
    @property
    def replays_failed(self) -> int: ...
    @property
    def clears(self) -> Mapping[ClearReason, int]: ...
    @property
    def predicted_hit_tokens(self) -> int:
        """Prompt tokens the index predicted cached, over the requests routed to the engine."""

    @property
    def reported_hit_tokens(self) -> float | None:
        """The engine's own `vllm:prefix_cache_hits_total` as last scraped; None while unknown."""


KvViews = Callable[[], Mapping[str, IndexStatus]]
"""Each engine's index status by engine id, read at the time of the request."""
