"""A batch cut into slices of bounded work means exactly what the whole batch meant."""

from __future__ import annotations

from headcount.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    SliceBound,
    event_blocks,
    slices,
)
from headcount.kvindex.index import EngineIndex
from headcount.kvindex.keys import block_keys

BOUND = SliceBound(blocks=100, tokens=256)
SIZE = 4
TOKENS = [n % 97 for n in range(3000 * SIZE)]


def applied(*batches: EventBatch) -> EngineIndex:
    index = EngineIndex()
    for batch in batches:
        for event in batch.events:
            index.apply(event)
    return index


def work(batch: EventBatch) -> tuple[int, int]:
    stored = [e for e in batch.events if isinstance(e, BlockStored)]
    tokens = sum(min(len(e.token_ids), len(e.block_hashes) * e.block_size) for e in stored)
    return sum(map(event_blocks, batch.events)), tokens


def test_a_long_stored_chain_cut_into_slices_keys_every_block_as_the_whole_did() -> None:
    whole = BlockStored(
        list(range(1, 3001)),
        None,
        TOKENS,
        SIZE,
        lora_name="ad",
        extra_keys=[("ad",)] * 2000 + [("ad", 7)] * 999,  # the last has none
    )
    batch = EventBatch(1.0, [whole, BlockRemoved(list(range(2900, 3001)))], 0)
    parts = list(slices(batch, BOUND))
    assert all(work(part)[0] <= BOUND.blocks and work(part)[1] <= BOUND.tokens for part in parts)
    assert {part.data_parallel_rank for part in parts} == {0}
    one, cut = applied(batch), applied(*parts)
    keys = block_keys(TOKENS, SIZE, "ad")
    assert len(cut) == len(one) == 2899
    assert cut.match(keys) == one.match(keys) == 2000  # the first with other extra keys
    assert cut.unknown_parents == one.unknown_parents == 0


def test_many_small_events_are_packed_in_order_and_a_batch_that_fits_is_itself() -> None:
    events: list[KvEvent] = [BlockRemoved([n]) for n in range(250)]
    events.insert(120, AllBlocksCleared())
    batch = EventBatch(1.0, events, None)
    parts = list(slices(batch, BOUND))
    assert [len(part.events) for part in parts] == [100, 100, 51]
    assert [e for part in parts for e in part.events] == events
    small = EventBatch(1.0, events[:10], None)
    assert list(slices(small, BOUND)) == [small]


def test_a_block_larger_than_a_slice_is_a_slice_of_its_own() -> None:
    big = BlockStored([1, 2], None, list(range(1000)), 500)
    parts = list(slices(EventBatch(1.0, [BlockRemoved([9]), big], 0), BOUND))
    assert [[type(e).__name__ for e in part.events] for part in parts] == [
        ["BlockRemoved"],
        ["BlockStored"],
        ["BlockStored"],
    ]
    assert applied(*parts).match(block_keys(list(range(1000)), 500, None)) == 2
