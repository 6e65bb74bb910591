"""A simulated engine's KV events, recorded, and the router's engine index fed from them.

`KvEventRecorder` is a simulated engine's `KvEventSink` that keeps what the
engine stored, evicted or cleared. `EventIndex` feeds each engine's recorded
events into a real `EngineIndex`, without ZMQ or the registry around it, so
routing tests check the router's predictions against the engine's truth
through the index the router uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from headcount.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from headcount.kvindex.index import EngineIndex
from headcount.kvindex.keys import BlockKey

__all__ = ["EventIndex", "KvEventRecorder"]


@dataclass
class KvEventRecorder:
    """A `KvEventSink` keeping every batch of events, each event a tuple."""

    batches: list[list[tuple[object, ...]]] = field(default_factory=list)
    current: list[tuple[object, ...]] = field(default_factory=list)

    def stored(
        self,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None,
    ) -> None:
        event = ("stored", list(block_hashes), parent_block_hash, list(token_ids))
        self.current.append((*event, block_size, lora_name))

    def removed(self, block_hashes: Sequence[int]) -> None:
        self.current.append(("removed", list(block_hashes)))

    def cleared(self) -> None:
        self.current.append(("cleared",))

    def end_step(self) -> None:
        self.batches.append(self.current)
        self.current = []

    def events(self) -> list[tuple[object, ...]]:
        return [event for batch in self.batches for event in batch]

    def take(self) -> list[tuple[object, ...]]:
        """Every event so far, forgetting them."""
        events = self.events()
        self.batches.clear()
        return events


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

    def prefilled(self, engine_id: str, predicted_cached_tokens: int) -> None:
        self.calls.append(("prefilled", engine_id, predicted_cached_tokens))


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
