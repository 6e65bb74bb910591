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
  the low 60 bits of the unsigned 64-bit int vLLM itself sends by default (the
  digest's last 8 bytes; a negative int taken modulo 2**64), so one block maps
  the same whichever form names it.
- `copies` counts physical blocks; more than `capacity` (the engine's
  `num_gpu_blocks`) means removals were missed: `overflowing`.
- After batches were lost (a gap the replay could not fill) the index is
  emptied, but what it held is kept as hints (`keep_as_hints`) until its
  owner drops them: the engine still holds most of it, and a prefix hit emits
  no event, so a warm prompt would otherwise stay unknown until evicted and
  stored again. `match` counts hints; a block the engine stores after a hint
  proves the hint's chain is still there (vLLM reaches a block only through
  every block before it): the hint is held again at once, its ancestors a
  bounded step at a time (`tidy`); a removal drops a hint. A second gap
  while hints are kept drops the older hints.

No event costs work in proportion to the whole index: keeping as hints,
dropping hints and clearing swap whole dictionaries (the held ones *become*
the hints), and what is dropped is freed, like ancestors are confirmed, by
`tidy` in steps of a bounded size that its owner runs between other work.

Memory is the owner's to bound: `limit` caps the blocks charged (held,
hints, extra copies, and what waits to be freed); a block stored past it is
not indexed (`refused`), which keeps the index true but incomplete, as after
missed events. The engine evicts its least recently used blocks, which the
router cannot see, so the index evicts nothing of its own: the engine's
removals make room. Hints are charged at their size when kept (their tables
keep that size until dropped), so a hint held again takes room of its own;
without room it stays a hint, still matched, until dropped. A block costs
two dictionary entries and two 60-bit ints (`BLOCK_BYTES`): engine hashes
and keys are cut to 60 bits, which CPython holds in 32 bytes where 64 bits
take 48.
"""

from __future__ import annotations

from collections.abc import Sequence

from headcount.kvevents import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent
from headcount.kvindex.keys import ROOT, BlockKey, chain

_EngineHash = int
"""An engine's block hash, normalised (`_normal`)."""
_MASK = (1 << 60) - 1
_Container = dict[int, int] | dict[int, _EngineHash | None] | list[_EngineHash]

__all__ = ["BLOCK_BYTES", "DEFAULT_CAPACITY", "EngineIndex"]

DEFAULT_CAPACITY = 4_000_000
"""Blocks held while the engine's own capacity is unknown: more than any single GPU holds
(an 80 GB H100 with an 8B model has about 28,000 blocks of 16 tokens), so only a stream
that never removes anything reaches it."""

BLOCK_BYTES = 192
"""The memory one block is charged, its worst case: an entry in two dictionaries (30 to 60
bytes each, by how full their tables are) and two 32-byte ints; `python -m
bench.micro.kv_index_memory` measures 126 bytes just before the tables double and 185 just
after."""


class EngineIndex:
    """Which blocks one engine holds; fed its events in order, asked which prefix it holds."""

    __slots__ = (
        "_copies",
        "_dropped",
        "_dropped_charge",
        "_dups",
        "_hint_charge",
        "_hint_dups",
        "_hint_holders",
        "_hint_key_of",
        "_holders",
        "_key_of",
        "_pending",
        "block_size",
        "capacity",
        "copies",
        "limit",
        "refused",
        "unknown_parents",
        "unknown_removals",
    )

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, limit: int = 2**62) -> None:
        self._key_of: dict[_EngineHash, BlockKey] = {}
        self._holders: dict[BlockKey, _EngineHash | None] = {}
        """The keys held, each with the parent of the first engine hash that stands for it."""
        self._dups: dict[BlockKey, int] = {}
        """Per key, how many more engine hashes stand for it (rare: one per key is usual)."""
        self._copies: dict[_EngineHash, int] = {}
        """Per engine hash stored more than once, its copies beyond the first."""
        self._hint_key_of: dict[_EngineHash, BlockKey] = {}
        self._hint_holders: dict[BlockKey, _EngineHash | None] = {}
        self._hint_dups: dict[BlockKey, int] = {}
        """What the index held before `keep_as_hints`, as it held it."""
        self._hint_charge = 0
        """The hints' blocks when they were kept: their tables keep that size until dropped."""
        self._pending: list[_EngineHash] = []
        """Hints whose chains upwards `tidy` confirms: a block stored after them proved them."""
        self._dropped: list[tuple[_Container, int]] = []
        """Containers `tidy` frees, each with the blocks it is charged."""
        self._dropped_charge = 0
        self.capacity = capacity
        self.limit = limit
        """The most blocks charged: past it, stored blocks are refused."""
        self.copies = 0
        self.block_size: int | None = None
        self.unknown_parents = 0
        self.unknown_removals = 0
        self.refused = 0
        """Blocks stored past `limit`, not indexed."""

    def __len__(self) -> int:
        """Distinct blocks held."""
        return len(self._holders)

    @property
    def hints(self) -> int:
        """Blocks held only as unconfirmed hints."""
        return len(self._hint_key_of)

    @property
    def keeps_hints(self) -> bool:
        """Whether hints are kept (maybe none left: confirmed or removed) until `drop_hints`."""
        return self._hint_charge > 0

    @property
    def kept(self) -> int:
        """The blocks charged for what the index holds: held, extra copies and hints."""
        return len(self._key_of) + len(self._copies) + len(self._pending) + self._hint_charge

    @property
    def charged(self) -> int:
        """The blocks charged against `limit`: what it keeps and what `tidy` has yet to free."""
        return self.kept + self._dropped_charge

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
        """Empty the index but keep what it held as hints until `drop_hints` (older hints are
        dropped): a block the engine stores after a hint proves the engine still holds the
        hint and its ancestors (a request reached it through them), which become held again;
        a removal drops one."""
        self.drop_hints()
        self._hint_key_of, self._hint_holders = self._key_of, self._holders
        self._hint_dups, self._hint_charge = self._dups, len(self._key_of)
        self._key_of, self._holders, self._dups = {}, {}, {}
        self._drop(self._copies, len(self._copies))
        self._copies = {}
        self.copies = 0

    def drop_hints(self) -> None:
        self._drop(self._hint_key_of, self._hint_charge)
        self._drop(self._hint_holders, 0)
        self._drop(self._hint_dups, 0)
        self._drop(self._pending, len(self._pending))
        self._hint_key_of, self._hint_holders, self._hint_dups = {}, {}, {}
        self._pending, self._hint_charge = [], 0

    def tidy(self, budget: int) -> int:
        """Do up to `budget` entries of deferred work: confirm hinted ancestors, then free
        what was dropped. The work done; 0 when nothing is left."""
        done = self._confirm_pending(budget)
        dropped = self._dropped
        while dropped and done < budget:
            container, charge = dropped[-1]
            count = min(budget - done, len(container))
            if isinstance(container, list):
                del container[-count:]
            else:
                pop = container.popitem
                for _ in range(count):
                    pop()
            done += count
            if not container:
                dropped.pop()
                self._dropped_charge -= charge
        return done

    @property
    def deferred(self) -> bool:
        """Whether `tidy` has work."""
        return bool(self._dropped or self._pending)

    def _full(self) -> bool:
        """Whether `charged` reached `limit` (spelled out: asked once per stored block)."""
        return (
            len(self._key_of) + len(self._copies) + len(self._pending) + self._hint_charge
            >= self.limit - self._dropped_charge
        )

    def _drop(self, container: _Container, charge: int) -> None:
        if container or charge:  # an emptied table keeps its size: freed by `tidy` too
            self._dropped.append((container, charge))
            self._dropped_charge += charge

    def _forget_held(self) -> None:
        self._drop(self._key_of, len(self._key_of))
        self._drop(self._holders, 0)
        self._drop(self._dups, 0)
        self._drop(self._copies, len(self._copies))
        self._key_of, self._holders, self._dups, self._copies = {}, {}, {}, {}
        self.copies = 0

    def _pop_hint(self, block_hash: _EngineHash) -> tuple[BlockKey, _EngineHash | None] | None:
        key = self._hint_key_of.pop(block_hash, None)
        if key is None:
            return None
        dups = self._hint_dups.get(key)
        if not dups:
            return key, self._hint_holders.pop(key)
        if dups > 1:
            self._hint_dups[key] = dups - 1
        else:
            del self._hint_dups[key]
        return key, self._hint_holders[key]

    def _confirm_pending(self, budget: int) -> int:
        """Hinted ancestors of proven hints held again, at most `budget` of them; without
        room to hold them, they stay hints."""
        done, pending = 0, self._pending
        while pending and done < budget and not self._full():
            walk = pending.pop()
            done += 1
            if walk not in self._key_of:
                parent = self._confirm(walk)
                if parent is not None:
                    pending.append(parent)
        return done

    def _confirm(self, block_hash: _EngineHash) -> _EngineHash | None:
        """Hold hinted `block_hash` again (room was checked); its parent, to confirm next."""
        hint = self._pop_hint(block_hash)
        if hint is None:
            return None
        self._add(block_hash, *hint)
        return hint[1]

    def _store(self, event: BlockStored) -> bool:
        size = event.block_size
        self.block_size = size
        parent_hash = None
        if event.parent_block_hash is None:
            parent = ROOT
        else:
            parent_hash = _normal(event.parent_block_hash)
            known = self._key_of.get(parent_hash)
            if known is None:
                known = self._hint_key_of.get(parent_hash)
                if known is None:
                    self.unknown_parents += 1
                    return False
                if not self._full():  # else it stays a hint
                    grandparent = self._confirm(parent_hash)
                    if grandparent is not None:
                        self._pending.append(grandparent)
            parent = known
        tokens = event.token_ids
        hashes = event.block_hashes
        for position, block_hash in enumerate(hashes):
            parent = chain(
                parent,
                tuple(tokens[position * size : (position + 1) * size]),
                _adapter(event, position),
            )
            normal = _normal(block_hash)
            self._pop_hint(normal)
            if not self._add(normal, parent, parent_hash):
                self.refused += len(hashes) - position - 1  # its descendants, unreachable
                break
            parent_hash = normal
        return True

    def _add(self, block_hash: _EngineHash, key: BlockKey, parent: _EngineHash | None) -> bool:
        """Hold one more copy of `block_hash`; False (refused) when the limit is reached."""
        if self._full():
            self.refused += 1
            return False
        self.copies += 1
        if block_hash in self._key_of:
            self._copies[block_hash] = self._copies.get(block_hash, 0) + 1
            return True
        self._key_of[block_hash] = key
        if key in self._holders:
            self._dups[key] = self._dups.get(key, 0) + 1
        else:
            self._holders[key] = parent
        return True

    def _remove(self, block_hash: _EngineHash) -> None:
        key = self._key_of.get(block_hash)
        if key is None:
            if self._pop_hint(block_hash) is None:
                self.unknown_removals += 1
            return
        self.copies -= 1
        extra = self._copies.get(block_hash)
        if extra is not None:
            if extra > 1:
                self._copies[block_hash] = extra - 1
            else:
                del self._copies[block_hash]
            return
        del self._key_of[block_hash]
        dups = self._dups.get(key)
        if not dups:
            del self._holders[key]
        elif dups > 1:
            self._dups[key] = dups - 1
        else:
            del self._dups[key]


def _normal(block_hash: BlockHash) -> _EngineHash:
    """The low 60 bits of the unsigned 64-bit form vLLM sends by default
    (`maybe_convert_block_hash`)."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash[-8:], "big") & _MASK
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
