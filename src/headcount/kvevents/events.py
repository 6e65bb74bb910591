"""vLLM's KV-cache events as values, one model for every wire layout vLLM has used.

A vLLM engine with prefix caching publishes, once per scheduler step that
changed its cache, a batch of events: `BlockStored` (blocks that became full
and cached, chained to their parent block), `BlockRemoved` (blocks evicted)
and `AllBlocksCleared` (the prefix cache was reset). These structs are vLLM's
current ones (vLLM 0.33 `vllm/distributed/kv_events.py`), field for field and
in declaration order, so nothing a current engine sends is lost. Only the
first four fields of `BlockStored` and the hashes of `BlockRemoved` are
required here: a layout that lacks the rest (vLLM 0.10's arrays, or engines
between the two) decodes with them None.

Block hashes are the engine's own: an int (unsigned 64-bit in current vLLM;
signed, possibly negative, under vLLM 0.10's default `builtin` hash) or bytes
(32 or 16 of them when vLLM runs with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`).
They identify a block for parent links and removals; they cannot be
recomputed outside the engine, whose hash algorithm and seed are its own.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KvEvent",
]

BlockHash = int | bytes
"""An engine's block hash as it came on the wire: an int (maybe negative) or bytes."""

MEDIUM_GPU = "GPU"
"""`medium` of blocks in GPU memory, the only tier a plain vLLM engine has."""


class _Event(msgspec.Struct, omit_defaults=True, gc=False, frozen=True, tag=True):
    """A tagged event: on the current wire a map whose first key is `"type"`."""


class BlockStored(_Event, frozen=True):
    """Full blocks newly cached, in order; `token_ids` holds all their tokens."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    """The block before the first of these, or None when they start the sequence."""
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    """vLLM's integer id of the LoRA adapter (deprecated upstream for `lora_name`)."""
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    """Per block, the untagged extra hash keys (LoRA name, mm pairs, cache salt...)."""
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(_Event, frozen=True):
    """Blocks evicted from the cache (vLLM sends one event per block)."""

    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(_Event, frozen=True):
    """The whole prefix cache was reset (vLLM's `POST /reset_prefix_cache`)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """One scheduler step's events; on the wire `[ts, events, data_parallel_rank]`."""

    ts: float
    """When the engine made the batch, seconds since the epoch."""
    events: list[KvEvent]
    data_parallel_rank: int | None = None
