"""One request as the `kv-aware` policy and the data plane see it: prompt, predictions, receipt.

A `KvRequest` travels in `RequestFeatures.kv`. The policy asks it what each
candidate holds cached (`cached`: the engine's index matched against the
prompt's block keys, computed once per block size and adapter, at most
`BLOCKS_PER_REQUEST` keys in all, whatever block sizes the engines claim and
however many ids the prompt has: a hit deeper than that is not predicted); the exchange
tells it when an attempt is dispatched (`dispatch`: the engine's
`prefill_queued` grows by the uncached prompt tokens and the index hears
`routed`) and when the engine's first byte arrives (`prefilled`).

The route receipt, on every response of a kv-aware routed request (on
failover, naming the engine that answered):

    x-headcount-engine: <engine name>
    x-headcount-cached-tokens: <prompt tokens predicted cached on it>
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from headcount.fleet import Engine
from headcount.kvindex.keys import BlockKey, block_keys

__all__ = ["BLOCKS_PER_REQUEST", "KvIndexView", "KvRequest"]

BLOCKS_PER_REQUEST = 8192
"""Block keys hashed for one request, over every block size its candidates have: 131,072
tokens at vLLM's default 16 per block, about 2 ms of hashing whatever the block size."""


class KvIndexView(Protocol):
    """What routing reads of, and tells, the engines' cache indexes (`kvindex.registry`)."""

    def match(self, engine_id: str, keys: Sequence[BlockKey]) -> int | None:
        """How many of `keys`' leading blocks the engine holds; None: its index is not usable
        (stale, off), route it by load."""

    def block_size(self, engine_id: str) -> int | None:
        """The engine's KV block size, None if not known."""

    def routed(self, engine_id: str, prompt_tokens: int, predicted_cached_tokens: int) -> None:
        """A request was dispatched to the engine."""

    def prefilled(self, engine_id: str, predicted_cached_tokens: int) -> None:
        """The engine's first response byte came (a 2xx): it has admitted the request and
        found what it had cached of the prompt (its hit counter has counted it)."""


class KvRequest:
    """The prompt of one kv-aware request and what was predicted for it per engine."""

    __slots__ = ("_budget", "_index", "_keys", "ids", "model", "predicted")

    def __init__(self, index: KvIndexView, model: str, ids: Sequence[int] | None) -> None:
        self._index = index
        self.model = model
        self.ids = ids
        """The prompt's token ids; None: not known (routed by load, no prediction)."""
        self.predicted: dict[str, int] = {}
        """Prompt tokens predicted cached, per engine id asked."""
        self._keys: dict[tuple[int, str | None], list[BlockKey]] = {}
        self._budget = BLOCKS_PER_REQUEST

    @property
    def prompt_tokens(self) -> int:
        return 0 if self.ids is None else len(self.ids)

    def cached(self, engine: Engine) -> int:
        """Prompt tokens `engine` is predicted to hold (0 when its index is not usable)."""
        ids = self.ids
        if ids is None:
            return 0
        size = self._index.block_size(engine.id)
        if size is None or size <= 0:
            tokens = 0
        else:
            lora = self.model if self.model in engine.adapters else None
            keys = self._keys.get((size, lora))
            if keys is None:
                # vLLM recomputes at least the last prompt token: a hit stops a token short.
                limit = min((len(ids) - 1) // size, self._budget)
                keys = self._keys[size, lora] = block_keys(ids, size, lora, limit=limit)
                self._budget -= len(keys)
            blocks = self._index.match(engine.id, keys) if keys else 0
            tokens = 0 if blocks is None else blocks * size
        self.predicted[engine.id] = tokens
        return tokens

    def keys(self, engine: Engine) -> tuple[Sequence[BlockKey], int]:
        """The prompt's block keys as `cached(engine)` computed them, and their block size
        (0, no keys: the engine's block size is not known)."""
        if engine.id not in self.predicted:
            self.cached(engine)
        size = self._index.block_size(engine.id)
        if size is None or size <= 0:
            return (), 0
        lora = self.model if self.model in engine.adapters else None
        return self._keys.get((size, lora), ()), size

    def dispatch(self, engine: Engine) -> int:
        """An attempt goes to `engine`: the prefill tokens it now queues (given back by the
        caller at first byte or end), after telling the index."""
        if self.ids is None:
            return 0
        cached = self.predicted.get(engine.id)
        if cached is None:
            cached = self.cached(engine)
        prompt = len(self.ids)
        self._index.routed(engine.id, prompt, cached)
        uncached = prompt - cached
        engine.load.prefill_queued += uncached
        return uncached

    def prefilled(self, engine: Engine) -> None:
        """`engine` answered: what was predicted cached there is held against its hits."""
        if self.ids is not None and engine.id in self.predicted:
            self._index.prefilled(engine.id, self.predicted[engine.id])

    def receipt(self, engine: Engine) -> bytes:
        """The route receipt's header lines for a response from `engine`."""
        return b"x-headcount-engine: %s\r\nx-headcount-cached-tokens: %d\r\n" % (
            engine.spec.name.encode("latin-1", "replace"),
            self.predicted.get(engine.id, 0),
        )
