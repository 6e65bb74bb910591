"""A tiny cache index built from a simulated engine's KV events, for routing tests.

It keys blocks as the router does (`kvindex.keys.chain` over each stored
block's token ids, from its parent's key), refcounts duplicates and forgets
removed blocks: enough to check the router's predictions against the engine's
truth, without the real index (`kvindex.registry`, built elsewhere).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from headcount.kvindex.keys import ROOT, BlockKey, chain
from tests.support import KvEventRecorder

__all__ = ["EventIndex"]


class EventIndex:
    """A `kvroute.KvIndexView` over the events each engine's recorder received."""

    def __init__(self, block_size: int) -> None:
        self.size = block_size
        self.recorders: dict[str, KvEventRecorder] = {}
        self._ours: dict[str, dict[int, BlockKey]] = {}
        self._held: dict[str, Counter[BlockKey]] = {}
        self.calls: list[tuple[object, ...]] = []

    def recorder(self, engine_id: str) -> KvEventRecorder:
        recorder = self.recorders[engine_id] = KvEventRecorder()
        return recorder

    def _apply(self, engine_id: str) -> Counter[BlockKey]:
        ours = self._ours.setdefault(engine_id, {})
        held = self._held.setdefault(engine_id, Counter())
        recorder = self.recorders.get(engine_id)
        for event in recorder.take() if recorder is not None else ():
            if event[0] == "stored":
                _, hashes, parent, tokens, size, lora = event
                key = ROOT if parent is None else ours[parent]  # type: ignore[index]
                for number, block_hash in enumerate(hashes):  # type: ignore[arg-type]
                    block = tuple(tokens[number * size : (number + 1) * size])  # type: ignore[index,operator]
                    key = chain(key, block, lora)  # type: ignore[arg-type]
                    ours[block_hash] = key
                    held[key] += 1
            elif event[0] == "removed":
                for block_hash in event[1]:  # type: ignore[attr-defined]
                    key = ours[block_hash]
                    held[key] -= 1
                    if held[key] <= 0:
                        del held[key], ours[block_hash]
            else:
                ours.clear()
                held.clear()
        return held

    def match(self, engine_id: str, keys: Sequence[BlockKey]) -> int | None:
        held = self._apply(engine_id)
        count = 0
        for key in keys:
            if held[key] <= 0:
                break
            count += 1
        return count

    def block_size(self, engine_id: str) -> int | None:
        return self.size

    def routed(self, engine_id: str, prompt_tokens: int, predicted_cached_tokens: int) -> None:
        self.calls.append(("routed", engine_id, prompt_tokens, predicted_cached_tokens))

    def prefilled(self, engine_id: str, new_blocks: int) -> None:
        self.calls.append(("prefilled", engine_id, new_blocks))
