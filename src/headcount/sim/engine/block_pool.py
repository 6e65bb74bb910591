"""The engine's KV blocks as vLLM's `BlockPool` keeps them: a fixed pool, a hash map, an LRU queue.

- `num_gpu_blocks` blocks, as vLLM counts them: block 0 is the null block,
  never used, so N - 1 hold tokens.
- A block holds `block_size` tokens' KV for every request referencing it
  (`ref_cnt`). Once full it is cached: its hash enters the map, and a later
  request whose prefix has the same hash chain reuses it.
- Blocks no request references wait in the free queue, least recently freed
  at the head. A cached one keeps its content until allocation takes it from
  the head, which evicts it (a `removed` event). A request frees its blocks
  tail first, so its last blocks are evicted before its first ones.
- The map keeps duplicates, as vLLM's does: two requests that computed the
  same block each cache their copy, stored and later removed once per copy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from headcount.sim.engine.block_hash import wire_hash
from headcount.sim.engine.kv_sink import KvEventSink

__all__ = ["Block", "BlockPool"]


@dataclass(eq=False, slots=True)
class Block:
    """One physical block; `digest` is set while it is cached."""

    block_id: int
    ref_cnt: int = 0
    digest: bytes | None = None
    parent: bytes | None = None
    token_ids: tuple[int, ...] = ()
    lora_name: str | None = None


class BlockPool:
    """Allocation, caching, LRU eviction and the events they produce."""

    def __init__(self, num_gpu_blocks: int, block_size: int, sink: KvEventSink) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.sink = sink
        self._blocks = [Block(block_id) for block_id in range(1, num_gpu_blocks)]
        self._free: OrderedDict[int, Block] = OrderedDict(
            (block.block_id, block) for block in self._blocks
        )
        self._cached: dict[bytes, dict[int, Block]] = {}
        self._events = False

    @property
    def usable(self) -> int:
        return len(self._blocks)

    @property
    def free_count(self) -> int:
        """Blocks no request references, cached or not."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """vLLM's `kv_cache_usage_perc`: blocks referenced by requests / usable blocks."""
        return (self.usable - self.free_count) / self.usable

    def longest_hit(self, digests: Sequence[bytes], limit: int) -> list[Block]:
        """The cached blocks for the longest run of `digests` from the first, at most `limit`."""
        hits: list[Block] = []
        for digest in digests[:limit]:
            copies = self._cached.get(digest)
            if not copies:
                break
            hits.append(next(iter(copies.values())))
        return hits

    def touch(self, blocks: Sequence[Block]) -> None:
        """Reference cached blocks for one more request."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, count: int) -> list[Block]:
        """`count` blocks from the head of the free queue, evicting what they cached."""
        blocks = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            if block.digest is not None:
                self.sink.removed([wire_hash(block.digest)])
                self._uncache(block)
                self._events = True
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def cache(
        self,
        blocks: Sequence[Block],
        digests: Sequence[bytes],
        parent: bytes | None,
        token_ids: Sequence[int],
        lora_name: str | None,
    ) -> None:
        """Cache newly full blocks (in order, `parent` before the first): one `stored` event."""
        size = self.block_size
        previous = parent
        for index, (block, digest) in enumerate(zip(blocks, digests, strict=True)):
            block.digest, block.parent, block.lora_name = digest, previous, lora_name
            block.token_ids = tuple(token_ids[index * size : (index + 1) * size])
            self._cached.setdefault(digest, {})[block.block_id] = block
            previous = digest
        self.sink.stored(
            [wire_hash(digest) for digest in digests],
            wire_hash(parent) if parent is not None else None,
            token_ids,
            size,
            lora_name,
        )
        self._events = True

    def free(self, blocks: Sequence[Block]) -> None:
        """Drop one request's references; unreferenced blocks join the queue, tail block first."""
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def reset(self) -> bool:
        """vLLM's `reset_prefix_cache`: forget every cached block and say so, only if no
        request holds a block."""
        if self.free_count != self.usable:
            return False
        self.forget()
        self.sink.cleared()
        self._events = True
        return True

    def forget(self) -> None:
        """Forget every cached block without an event, as a restarted engine has."""
        for copies in self._cached.values():
            for block in copies.values():
                block.digest = block.parent = None
                block.token_ids = ()
        self._cached.clear()

    def end_step(self) -> None:
        """Close the events since the last call into one batch, if there were any."""
        if self._events:
            self._events = False
            self.sink.end_step()

    def held(self) -> Iterator[Block]:
        """Every cached block: those in use, then the free ones in eviction order."""
        yield from (b for b in self._blocks if b.ref_cnt and b.digest is not None)
        yield from (b for b in self._free.values() if b.digest is not None)

    def _uncache(self, block: Block) -> None:
        assert block.digest is not None
        copies = self._cached[block.digest]
        del copies[block.block_id]
        if not copies:
            del self._cached[block.digest]
        block.digest = block.parent = None
        block.token_ids = ()
