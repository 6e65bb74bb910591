"""The router's engine index fed straight from a simulated engine's KV-event sink, for tests.

Each engine's recorder (the simulator's `KvEventSink`) hands over what the
engine stored, evicted or cleared; the events go into a real `EngineIndex`,
without ZMQ or the registry around it, so routing tests check the router's
predictions against the engine's truth through the index the router uses.
"""

from __future__ import annotations

from collections.abc import Sequence

from headcount.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from headcount.kvindex.index import EngineIndex
from headcount.kvindex.keys import BlockKey
from tests.support import KvEventRecorder

__all__ = ["EventIndex"]


class EventIndex:
    """A `routing.kv.KvIndexView` over the events each engine's recorder received."""

    def __init__(self, block_size: int) -> None:
        self.size = block_size
        self.recorders: dict[str, KvEventRecorder] = {}
        self._indexes: dict[str, EngineIndex] = {}
        self.calls: list[tuple[object, ...]] = []

    def recorder(self, engine_id: str) -> KvEventRecorder:
        recorder = self.recorders[engine_id] = KvEventRecorder()
        return recorder

    def match(self, engine_id: str, keys: Sequence[BlockKey]) -> int | None:
        index = self._indexes.setdefault(engine_id, EngineIndex())
        recorder = self.recorders.get(engine_id)
        for event in recorder.take() if recorder is not None else ():
            index.apply(_event(event))
        return index.match(keys)

    def block_size(self, engine_id: str) -> int | None:
        return self.size

    def routed(self, engine_id: str, prompt_tokens: int, predicted_cached_tokens: int) -> None:
        self.calls.append(("routed", engine_id, prompt_tokens, predicted_cached_tokens))

    def prefilled(self, engine_id: str, new_blocks: int, predicted_cached_tokens: int) -> None:
        self.calls.append(("prefilled", engine_id, new_blocks, predicted_cached_tokens))


def _event(recorded: tuple[object, ...]) -> KvEvent:
    """A recorded sink call as the event vLLM would publish for it."""
    if recorded[0] == "stored":
        _, hashes, parent, tokens, size, lora = recorded
        return BlockStored(
            list(hashes),  # type: ignore[call-overload]
            parent,  # type: ignore[arg-type]
            list(tokens),  # type: ignore[call-overload]
            size,  # type: ignore[arg-type]
            lora_name=lora,  # type: ignore[arg-type]
        )
    if recorded[0] == "removed":
        return BlockRemoved(list(recorded[1]))  # type: ignore[call-overload]
    return AllBlocksCleared()
