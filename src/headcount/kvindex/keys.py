"""The router's own identity for a KV block: a chained hash of its token ids and LoRA adapter.

An engine's block hashes depend on its hash algorithm and seed, which a router
cannot know, so the index keys blocks by a hash of its own, computed the same
way from a `BlockStored` event's token ids and from a request's: a block's key
hashes its parent's key, its tokens and the adapter, so two prompts share a
block only if everything before it is the same too (as in vLLM). The hash is
the low 60 bits of Python's `hash` of a tuple, fast and stable within the
process, which is the only place keys live (60 bits, because CPython holds
them in 32 bytes where 64 take 48, and an index holds millions); a collision
(one in 2**60, or crafted by a client) only mispredicts a cache hit, it
never misroutes a request.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ROOT", "BlockKey", "block_keys", "chain"]

BlockKey = int
_MASK = (1 << 60) - 1

ROOT: BlockKey = 0
"""The parent key of a sequence's first block."""


def chain(parent: BlockKey, tokens: tuple[int, ...], lora: str | None) -> BlockKey:
    """The key of the block holding `tokens` after the block keyed `parent`."""
    return hash((parent, tokens, lora)) & _MASK


def block_keys(
    token_ids: Sequence[int],
    block_size: int,
    lora: str | None,
    *,
    parent: BlockKey = ROOT,
    limit: int | None = None,
) -> list[BlockKey]:
    """The keys of the full blocks of `token_ids`, chained from `parent`; at most `limit`."""
    count = len(token_ids) // block_size
    if limit is not None:
        count = min(count, limit)
    keys: list[BlockKey] = []
    append, mask = keys.append, _MASK
    key = parent
    for start in range(0, count * block_size, block_size):
        key = hash((key, tuple(token_ids[start : start + block_size]), lora)) & mask
        append(key)
    return keys
