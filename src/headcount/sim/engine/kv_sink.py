"""Where the simulated prefix cache reports its stores and evictions, for a KV-event publisher.

The cache calls these as its blocks change, and `end_step` once per scheduler
step; the KV-event publisher (`kv_publisher`) turns each step into one batch.
Block hashes are the engine's own unsigned 64-bit ints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["KvEventSink"]


class KvEventSink(Protocol):
    def stored(
        self,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None,
    ) -> None: ...
    def removed(self, block_hashes: Sequence[int]) -> None: ...
    def cleared(self) -> None: ...
    def end_step(self) -> None: ...  # events since the last end_step form one batch
