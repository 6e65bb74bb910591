"""One generation request's life in the engine: admission, its prompt's prefill, its tokens' blocks.

Without a prefix cache (`Run`) a request needs only a slot, and its tokens
take `token_delay` each. With one (`CachedRun`, `--kv-blocks`), admission
also takes its prompt's KV blocks and counts its cache hit, its uncached
prompt tokens then go through the prefill pipeline, and its tokens take
blocks as they are generated, cached as they fill. A token that needs a block
none can give preempts the request scheduled last (itself, if it is that
one), as vLLM's scheduler does; a preempted request waits to be admitted
again, recomputes its prompt and the tokens it had generated (less what it
finds cached) and goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

from headcount.sim.engine.kv_cache import KvCache, KvSequence
from headcount.sim.engine.parsing import Generation
from headcount.sim.engine.prefill import PrefillPipeline
from headcount.sim.engine.scheduler import Scheduler
from headcount.sim.engine.timebase import Timebase

__all__ = ["CachedRun", "PrefixCaching", "Run"]


class Run:
    """A generation request on an engine without a prefix cache."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self.prefill_starts_at = 0.0
        """When its prompt's prefill begins (engine clock), once admitted: vLLM counts it
        running from then (scheduled), waiting before."""
        self.prefilled_at = 0.0
        """When its prompt's prefill ends (engine clock), once admitted."""
        self.finishes_at = 0.0
        """When its last token is due, once admitted."""

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens found in the cache at admission (None: no prefix cache)."""
        return None

    def admit(self) -> bool:
        return True

    def release(self) -> None:
        pass

    async def prefill(self) -> None:
        """Wait until the prompt's prefill is done."""

    async def generated(self, tokens: int) -> None:
        """`tokens` tokens are out (waiting first, if it is preempted, to run again)."""

    def checkpoints(self) -> list[int]:
        """The token counts at which a response generated all at once must stop (to cache
        the blocks filled so far), the last one included."""
        return [self.generation.max_tokens]


@dataclass(frozen=True)
class PrefixCaching:
    """What a run on an engine with a prefix cache uses."""

    kv: KvCache
    pipeline: PrefillPipeline
    timebase: Timebase
    token_delay: float
    scheduler: Scheduler[Run]


class CachedRun(Run):
    """A generation request on an engine with a prefix cache."""

    def __init__(self, generation: Generation, caching: PrefixCaching, seq: KvSequence) -> None:
        super().__init__(generation)
        self._caching = caching
        self.sequence = seq

    @property
    def cached_tokens(self) -> int | None:
        return self.sequence.cached_tokens

    def admit(self) -> bool:
        caching, seq = self._caching, self.sequence
        hit = len(caching.kv.hit(seq)) * caching.kv.block_size
        if not caching.kv.admit(seq):
            return False
        self.prefill_starts_at, self.prefilled_at = caching.pipeline.admit(seq.num_tokens - hit)
        left = self.generation.max_tokens - seq.generated
        self.finishes_at = self.prefilled_at + left * caching.token_delay
        return True

    def release(self) -> None:
        self._caching.kv.release(self.sequence)

    async def prefill(self) -> None:
        timebase = self._caching.timebase
        wait = self.prefilled_at - timebase.now()
        if wait > 0:
            await timebase.sleep(wait)

    async def generated(self, tokens: int) -> None:
        caching = self._caching
        scheduler = caching.scheduler
        preempted = False
        while True:
            if await scheduler.resumed(self):
                await self.prefill()  # its recomputation
            if caching.kv.advance(self.sequence, tokens):
                break
            scheduler.preempt_newest()
            preempted = True
        if preempted:
            scheduler.wake()  # what was freed beyond this token's needs may admit someone

    def checkpoints(self) -> list[int]:
        last = self.generation.max_tokens
        size, prompt = self._caching.kv.block_size, self.generation.prompt_tokens
        # k tokens out: the KV of the prompt and k - 1 of them is computed
        first = (prompt // size + 1) * size - prompt + 1
        return [*range(first, last, size), last]
