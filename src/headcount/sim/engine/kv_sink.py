"""Where the prefix cache's events go: the seam between the block pool and a KV-event publisher.

The block pool reports what vLLM's `BlockPool` reports, when it reports it:
`stored` when blocks become full and cached (prompt blocks at admission,
blocks filled by generated tokens as they fill), `removed` when a cached
block is evicted to be reused (one call per block), `cleared` when the cache
is reset on request. Every call between two `end_step` calls forms one batch,
as one scheduler step's events form one `KVEventBatch` in vLLM; `end_step` is
called only after a step that produced events.

A block hash is the engine's own: the last 8 bytes of a SHA-256 chained over
(parent hash, token ids, extra keys), as an unsigned int, which is what vLLM
sends by default. A router must key its index on the token ids, not on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["KvEventSink", "NullKvEventSink"]


class KvEventSink(Protocol):
    """Receives the block pool's events (a publisher, a recorder in tests, or nothing).

    Its methods do nothing, so a sink may subclass it and implement only what it needs."""

    def stored(
        self,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None,
    ) -> None:
        """Blocks became full and cached, in order; `token_ids` are all their tokens."""
        return None

    def removed(self, block_hashes: Sequence[int]) -> None:
        """A cached block was evicted."""
        return None

    def cleared(self) -> None:
        """Every cached block was forgotten (vLLM's reset)."""
        return None

    def end_step(self) -> None:
        """The events since the last `end_step` form one batch."""
        return None


class NullKvEventSink(KvEventSink):
    """The default: events go nowhere."""
