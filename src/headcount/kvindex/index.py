"""One engine's cached blocks, as its KV events describe them, keyed by the router's own block hash.

An engine names its blocks by hashes the router cannot recompute (its hash
function and seed are its own), so each stored block is keyed by
`keys.chain` over its token ids, chained from its parent's key, and the
engine's hash only maps to that key for parent links and removals. A request
then matches by computing its own keys: `match` walks them until the first
block the engine does not hold.

- `BlockStored` chains from `parent_block_hash` (None: the sequence's first
  block). A parent the index does not know means the engine holds a prefix
  the index never saw (events were missed): those blocks are skipped and
  counted in `unknown_parents`, which keeps the index rebuilding.
- The LoRA part of a key is the adapter's name (`lora_name`, which vLLM also
  writes as the block's `extra_keys` entry `(name,)`), as a request names it
  in `model`. A block with other extra keys (a cache salt, images) and an
  event with only vLLM 0.10's integer `lora_id` get keys no text request can
  match: the router cannot map ids to names or know the salt.
- vLLM does not deduplicate: two requests filling the same uncached prefix
  at once store the same hash twice and evict each copy separately, so
  engine hashes are counted and a block leaves the index with its last copy.
  A removal of a hash the index does not hold is ignored (and counted).
- Hashes come as ints (negative under vLLM 0.10's `builtin` hash) or bytes
  (vLLM with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`); both are normalised to
  the unsigned 64-bit int vLLM itself sends by default (the digest's last 8
  bytes; a negative int taken modulo 2**64), so one block maps the same
  whichever form names it.
- `copies` counts physical blocks; more than `capacity` (the engine's
  `num_gpu_blocks`) means removals were missed: `overflowing`.
- After batches were lost (a gap the replay could not fill) the index is
  emptied, but what it held is kept as hints (`keep_as_hints`) until its
  owner drops them: the engine still holds most of it, and a prefix hit emits
  no event, so a warm prompt would otherwise stay unknown until evicted and
  stored again. `match` counts hints; a block the engine stores after a hint
  proves the hint's chain is still there (vLLM reaches a block only through
  every block before it) and makes it held again; a removal drops a hint.
"""

from __future__ import annotations

from collections.abc import Sequence

from headcount.kvevents import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent
from headcount.kvindex.keys import ROOT, BlockKey, chain

_EngineHash = int
"""An engine's block hash, normalised (`_normal`)."""
_MASK = (1 << 64) - 1

__all__ = ["DEFAULT_CAPACITY", "EngineIndex"]

DEFAULT_CAPACITY = 4_000_000
"""Blocks held while the engine's own capacity is unknown: more than any single GPU holds
(an 80 GB H100 with an 8B model has about 28,000 blocks of 16 tokens), so only a stream
that never removes anything reaches it (about 400 MB of index)."""


class EngineIndex:
    """Which blocks one engine holds; fed its events in order, asked which prefix it holds."""

    __slots__ = (
        "_copies",
        "_hint_holders",
        "_hints",
        "_holders",
        "_key_of",
        "_parent_of",
        "block_size",
        "capacity",
        "copies",
        "unknown_parents",
        "unknown_removals",
    )

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._key_of: dict[_EngineHash, BlockKey] = {}
        self._copies: dict[_EngineHash, int] = {}
        self._holders: dict[BlockKey, int] = {}
        """Per key, how many distinct engine hashes stand for it."""
        self._parent_of: dict[_EngineHash, _EngineHash | None] = {}
        self._hints: dict[_EngineHash, tuple[BlockKey, _EngineHash | None]] = {}
        """What the index held before `keep_as_hints`: key and parent per engine hash."""
        self._hint_holders: dict[BlockKey, int] = {}
        self.capacity = capacity
        self.copies = 0
        self.block_size: int | None = None
        self.unknown_parents = 0
        self.unknown_removals = 0

    def __len__(self) -> int:
        """Distinct blocks held."""
        return len(self._holders)

    @property
    def hints(self) -> int:
        """Blocks held only as unconfirmed hints."""
        return len(self._hints)

    @property
    def overflowing(self) -> bool:
        return self.copies > self.capacity

    def apply(self, event: KvEvent) -> bool:
        """Apply one event; False when a stored block's parent was unknown (blocks skipped)."""
        if isinstance(event, BlockStored):
            return self._store(event)
        if isinstance(event, BlockRemoved):
            for block_hash in event.block_hashes:
                self._remove(_normal(block_hash))
        elif isinstance(event, AllBlocksCleared):
            self.clear()
        return True

    def match(self, keys: Sequence[BlockKey]) -> int:
        """How many of `keys`, from the first, the engine holds."""
        holders, hints = self._holders, self._hint_holders
        count = 0
        for key in keys:
            if key not in holders and key not in hints:
                break
            count += 1
        return count

    def clear(self) -> None:
        """Forget everything: the engine's cache is empty."""
        self._forget_held()
        self.drop_hints()

    def keep_as_hints(self) -> None:
        """Empty the index but keep what it held as hints until `drop_hints`: a block the
        engine stores after a hint proves the engine still holds the hint and its ancestors
        (a request reached it through them), which become held again; a removal drops one."""
        for block_hash, key in self._key_of.items():
            self._add_hint(block_hash, key, self._parent_of.get(block_hash))
        self._forget_held()

    def drop_hints(self) -> None:
        self._hints.clear()
        self._hint_holders.clear()

    def _forget_held(self) -> None:
        self._key_of.clear()
        self._parent_of.clear()
        self._copies.clear()
        self._holders.clear()
        self.copies = 0

    def _add_hint(self, block_hash: _EngineHash, key: BlockKey, parent: _EngineHash | None) -> None:
        if block_hash not in self._hints:
            self._hints[block_hash] = (key, parent)
            self._hint_holders[key] = self._hint_holders.get(key, 0) + 1

    def _pop_hint(self, block_hash: _EngineHash) -> tuple[BlockKey, _EngineHash | None] | None:
        hint = self._hints.pop(block_hash, None)
        if hint is not None:
            holders = self._hint_holders[hint[0]]
            if holders > 1:
                self._hint_holders[hint[0]] = holders - 1
            else:
                del self._hint_holders[hint[0]]
        return hint

    def _confirm(self, block_hash: _EngineHash) -> BlockKey | None:
        """The key of hinted `block_hash`, held again with the hinted ancestors above it."""
        confirmed: list[tuple[_EngineHash, BlockKey, _EngineHash | None]] = []
        walk: _EngineHash | None = block_hash
        while walk is not None and walk not in self._key_of:
            hint = self._pop_hint(walk)
            if hint is None:
                break
            confirmed.append((walk, *hint))
            walk = hint[1]
        for each, key, parent in reversed(confirmed):
            self._add(each, key, parent)
        return self._key_of.get(block_hash)

    def _store(self, event: BlockStored) -> bool:
        size = event.block_size
        self.block_size = size
        parent_hash = None
        if event.parent_block_hash is None:
            parent = ROOT
        else:
            parent_hash = _normal(event.parent_block_hash)
            known = self._key_of.get(parent_hash)
            if known is None and parent_hash in self._hints:
                known = self._confirm(parent_hash)
            if known is None:
                self.unknown_parents += 1
                return False
            parent = known
        tokens = event.token_ids
        for position, block_hash in enumerate(event.block_hashes):
            parent = chain(
                parent,
                tuple(tokens[position * size : (position + 1) * size]),
                _adapter(event, position),
            )
            normal = _normal(block_hash)
            self._pop_hint(normal)
            self._add(normal, parent, parent_hash)
            parent_hash = normal
        return True

    def _add(self, block_hash: _EngineHash, key: BlockKey, parent: _EngineHash | None) -> None:
        self.copies += 1
        copies = self._copies.get(block_hash, 0)
        self._copies[block_hash] = copies + 1
        if copies:
            return
        self._key_of[block_hash] = key
        self._parent_of[block_hash] = parent
        self._holders[key] = self._holders.get(key, 0) + 1

    def _remove(self, block_hash: _EngineHash) -> None:
        copies = self._copies.get(block_hash)
        if copies is None:
            if self._pop_hint(block_hash) is None:
                self.unknown_removals += 1
            return
        self.copies -= 1
        if copies > 1:
            self._copies[block_hash] = copies - 1
            return
        del self._copies[block_hash]
        del self._parent_of[block_hash]
        key = self._key_of.pop(block_hash)
        holders = self._holders[key]
        if holders > 1:
            self._holders[key] = holders - 1
        else:
            del self._holders[key]


def _normal(block_hash: BlockHash) -> _EngineHash:
    """The unsigned 64-bit form vLLM sends by default (`maybe_convert_block_hash`)."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash[-8:], "big")
    return block_hash & _MASK


def _adapter(event: BlockStored, position: int) -> str | None:
    """The LoRA part of the key of the event's `position`-th block, as a request names it."""
    extras = event.extra_keys
    extra = extras[position] if extras and position < len(extras) else None
    if extra:
        if extra == (event.lora_name,):
            return event.lora_name
        return f"\x00extra:{extra!r}"
    if event.lora_name is not None:
        return event.lora_name
    if event.lora_id is not None:
        return f"\x00lora-id:{event.lora_id}"
    return None
