"""A request's KV blocks over its life, and the hit counters: what vLLM's KV cache manager does.

- Admission looks up the longest run of the prompt's leading full blocks that
  is cached, capped at the prompt's length minus one token (vLLM recomputes
  the last token), and counts it: `queries` grows by the prompt's tokens and
  `hits` by the tokens found (vLLM's `prefix_cache_queries` and
  `prefix_cache_hits`, recorded at admission).
- It then takes the hit blocks, allocates blocks for the rest of the prompt
  and caches the prompt's full ones at once (vLLM caches a chunk's blocks when
  it schedules it, so a request admitted after it already finds them).
- A request is admitted when the pool can give it the blocks of its prompt
  (vLLM's `allocate_slots` with the full sequence gated, no watermark); its
  output's blocks are allocated as its tokens need them, and when none is
  free the scheduler preempts (`advance` says so). One that could never fit
  even alone is refused.
- Each generated token's KV is computed when the next one is generated;
  blocks filled by them are cached as they fill. Finishing, disconnecting or
  being preempted frees the request's blocks.
- A preempted request admitted again needs blocks for its prompt and the
  tokens it had generated, and recomputes what it does not find cached; as
  vLLM's, that second lookup counts in no hit counter and does not change
  the `cached_tokens` its usage reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from headcount.sim.engine.block_hash import block_digests, wire_hash
from headcount.sim.engine.block_pool import Block, BlockPool
from headcount.sim.engine.kv_sink import KvEventSink

__all__ = ["KvCache", "KvSequence"]


@dataclass(eq=False)
class KvSequence:
    """One request's tokens and the blocks it holds."""

    prompt: Sequence[int]
    output: Sequence[int]
    """The ids of every token it will generate."""
    lora_name: str | None
    digests: list[bytes]
    """The hashes of its cached (or to be cached) full blocks, prompt first."""
    blocks: list[Block] = field(default_factory=list)
    cached_tokens: int = 0
    """Prompt tokens found in the cache at its first admission."""
    generated: int = 0
    """Tokens it has generated so far."""
    admissions: int = 0
    stored: int = 0
    """Of its blocks, how many are cached."""

    @property
    def num_tokens(self) -> int:
        """vLLM's `num_tokens`: the prompt and the tokens generated so far."""
        return len(self.prompt) + self.generated

    def tokens(self, start: int, end: int) -> list[int]:
        """Its token ids (prompt, then output) from `start` to `end`."""
        size = len(self.prompt)
        if end <= size:
            return list(self.prompt[start:end])
        return [*self.prompt[start:size], *self.output[max(start - size, 0) : end - size]]


class KvCache:
    """The block pool, the requests' block tables and the hit counters."""

    def __init__(self, num_gpu_blocks: int, block_size: int, sink: KvEventSink) -> None:
        self.pool = BlockPool(num_gpu_blocks, block_size, sink)
        self.block_size = block_size
        self.queries = 0
        self.hits = 0

    def sequence(
        self, prompt: Sequence[int], output: Sequence[int], lora_name: str | None
    ) -> KvSequence:
        digests = block_digests(prompt, self.block_size, lora_name)
        return KvSequence(prompt, output, lora_name, digests)

    def fits_ever(self, seq: KvSequence) -> bool:
        """Whether the pool could hold `seq` at all."""
        return self._blocks_for(len(seq.prompt) + len(seq.output) - 1) <= self.pool.usable

    def hit(self, seq: KvSequence) -> list[Block]:
        """The cached blocks `seq` would start from if admitted now."""
        limit = (seq.num_tokens - 1) // self.block_size
        return self.pool.longest_hit(seq.digests, limit)

    def admit(self, seq: KvSequence) -> bool:
        """Give `seq` the blocks of its tokens so far and count its hit (first admission only);
        False (nothing changed) when they do not fit."""
        pool, size = self.pool, self.block_size
        hit = self.hit(seq)
        tokens = seq.num_tokens
        now = self._blocks_for(tokens) - len(hit)
        hit_free = sum(1 for block in hit if block.ref_cnt == 0)
        if pool.free_count - hit_free < now:
            return False
        if not seq.admissions:
            self.queries += tokens
            self.hits += len(hit) * size
            seq.cached_tokens = len(hit) * size
        seq.admissions += 1
        pool.touch(hit)
        seq.blocks = [*hit, *pool.allocate(now)]
        seq.stored = len(hit)
        self._store(seq, tokens // size)
        pool.end_step()
        return True

    def advance(self, seq: KvSequence, generated: int) -> bool:
        """`generated` tokens are out: the KV of the prompt and all but the last is computed.
        False (nothing changed) when the blocks that needs are not free: preempt someone."""
        computed = len(seq.prompt) + generated - 1
        missing = self._blocks_for(computed) - len(seq.blocks)
        if missing > self.pool.free_count:
            return False
        if missing > 0:
            seq.blocks += self.pool.allocate(missing)
        seq.generated = generated
        self._store(seq, computed // self.block_size)
        self.pool.end_step()
        return True

    def release(self, seq: KvSequence) -> None:
        """`seq` is done, gone or preempted: free its blocks."""
        self.pool.free(seq.blocks)
        seq.blocks = []

    def clear(self, announce: bool) -> bool:
        """Forget every cached block: with `announce`, as vLLM's reset (only when no request
        holds a block, with an AllBlocksCleared event); without, silently, as a restart."""
        if announce:
            cleared = self.pool.reset()
        else:
            self.pool.forget()
            cleared = True
        self.pool.end_step()
        return cleared

    def view(self) -> dict[str, object]:
        """Exactly what the cache holds and has counted (`/sim/kv-cache`)."""
        pool = self.pool
        return {
            "block_size": self.block_size,
            "num_gpu_blocks": pool.num_gpu_blocks,
            "usage": pool.usage,
            "free_blocks": pool.free_count,
            "queries": self.queries,
            "hits": self.hits,
            "blocks": [
                {
                    "hash": wire_hash(block.digest),
                    "parent": wire_hash(block.parent) if block.parent is not None else None,
                    "token_ids": list(block.token_ids),
                    "lora": block.lora_name,
                    "ref_cnt": block.ref_cnt,
                }
                for block in pool.held()
                if block.digest is not None
            ],
        }

    def _store(self, seq: KvSequence, full: int) -> None:
        """Cache `seq`'s blocks that are full now (the first `full`) and not cached yet."""
        first = seq.stored
        if full <= first:
            return
        size = self.block_size
        if full > len(seq.digests):
            parent = seq.digests[-1] if seq.digests else None
            tokens = seq.tokens(len(seq.digests) * size, full * size)
            seq.digests += block_digests(tokens, size, seq.lora_name, parent=parent)
        parent = seq.digests[first - 1] if first else None
        self.pool.cache(
            seq.blocks[first:full],
            seq.digests[first:full],
            parent,
            seq.tokens(first * size, full * size),
            seq.lora_name,
        )
        seq.stored = full

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)
