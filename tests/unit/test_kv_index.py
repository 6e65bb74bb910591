"""An engine's index against an independent model: bytes vLLM's publisher sent, random streams.

The model keys every block by the whole token prefix it ends (and its
adapter), with no hashing at all, so it cannot share a bug with the index's
chained keys. What the index says a prompt holds must be what the model says.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from headcount.kvevents import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KvEvent,
    decode_batch,
)
from headcount.kvindex.index import BLOCK_BYTES, EngineIndex
from headcount.kvindex.keys import block_keys
from tests.support.kv_fixtures import VERSIONS, fixture, frames_of

__all__: list[str] = []

BLOCK = 4


class PrefixModel:
    """Blocks as (adapter, every token up to and including the block), counted per copy."""

    def __init__(self) -> None:
        self.prefix_of: dict[BlockHash, tuple[str | None, tuple[int, ...]]] = {}
        self.copies: Counter[BlockHash] = Counter()

    def apply(self, event: KvEvent) -> None:
        if isinstance(event, AllBlocksCleared):
            self.prefix_of.clear()
            self.copies.clear()
        elif isinstance(event, BlockRemoved):
            for block_hash in event.block_hashes:
                if self.copies[block_hash] > 0:
                    self.copies[block_hash] -= 1
                    if not self.copies[block_hash]:
                        del self.prefix_of[block_hash]
        elif event.parent_block_hash is None or event.parent_block_hash in self.prefix_of:
            start = (
                ()
                if event.parent_block_hash is None
                else self.prefix_of[event.parent_block_hash][1]
            )
            size = event.block_size
            for position, block_hash in enumerate(event.block_hashes):
                tokens = (*start, *event.token_ids[: (position + 1) * size])
                self.prefix_of.setdefault(block_hash, (_adapter(event), tokens))
                self.copies[block_hash] += 1

    def match(self, tokens: Sequence[int], lora: str | None, size: int) -> int:
        held = set(self.prefix_of.values())
        count = 0
        while (lora, tuple(tokens[: (count + 1) * size])) in held and (count + 1) * size <= len(
            tokens
        ):
            count += 1
        return count


NO_NAME = "no request names this adapter"


def _adapter(event: BlockStored) -> str | None:
    """vLLM 0.10 names an adapter by an id only: no request's `model` can match its blocks."""
    if event.lora_name is None and event.lora_id is not None:
        return NO_NAME
    return event.lora_name


def agree(index: EngineIndex, model: PrefixModel, size: int) -> None:
    """Every prefix the model holds is matched alike, asked as a request would ask."""
    for lora, tokens in list(model.prefix_of.values()):
        asked = None if lora == NO_NAME else lora
        assert index.match(block_keys(tokens, size, asked)) == model.match(tokens, asked, size)


def test_the_fixtures_from_vllms_own_publisher_index_as_the_model_says() -> None:
    for version, _ in VERSIONS:
        index, model = EngineIndex(), PrefixModel()
        most = 0
        for frames in fixture(version)["sub_frames"]:
            for event in decode_batch(frames_of(frames)[2]).events:
                index.apply(event)
                model.apply(event)
                if isinstance(event, BlockStored):
                    agree(index, model, event.block_size)
                assert len(index) == len(set(model.prefix_of.values())), version
                most = max(most, len(index))
        assert most > 0, version


def test_both_wire_layouts_build_the_same_index() -> None:
    """The fixtures' first batches mean the same in both layouts, but 0.10 names the adapter
    only by id: its LoRA block is held, and no request can match it."""
    head, tail = list(range(100, 132)), list(range(200, 216))
    asked = [(head, None), ([*head, *tail], None), (tail, "sql-lora")]
    seen: dict[str, list[tuple[int, list[int]]]] = {}
    for version, _ in VERSIONS:
        index = EngineIndex()
        for frames in fixture(version)["sub_frames"][:4]:
            for event in decode_batch(frames_of(frames)[2]).events:
                index.apply(event)
            seen.setdefault(version, []).append(
                (len(index), [index.match(block_keys(t, 16, lora)) for t, lora in asked])
            )
    assert seen["0.10.1"] == [(2, [2, 2, 0]), (2, [0, 0, 0]), (3, [0, 0, 0]), (0, [0, 0, 0])]
    assert seen["0.33.0"] == [(2, [2, 2, 0]), (2, [0, 0, 0]), (3, [0, 0, 1]), (0, [0, 0, 0])]


def test_a_block_maps_the_same_whichever_form_its_hash_takes() -> None:
    index = EngineIndex()
    digest = bytes(24) + (7).to_bytes(8, "big")
    index.apply(stored([-1, digest], None, list(range(8))))
    index.apply(stored([9], 7, [8, 9, 10, 11]))
    keys = block_keys(list(range(12)), BLOCK, None)
    assert (index.match(keys), index.unknown_parents) == (3, 0)
    index.apply(BlockRemoved([(1 << 64) - 1]))
    assert (len(index), index.unknown_removals, index.match(keys)) == (2, 0, 0)


def stored(
    hashes: list[BlockHash], parent: BlockHash | None, tokens: list[int], **extra: object
) -> BlockStored:
    return BlockStored(hashes, parent, tokens, BLOCK, **extra)  # type: ignore[arg-type]


def test_a_block_stored_twice_stays_until_its_last_copy_is_evicted() -> None:
    index = EngineIndex()
    for _ in range(2):
        index.apply(stored([7], None, [1, 2, 3, 4]))
    keys = block_keys([1, 2, 3, 4], BLOCK, None)
    index.apply(BlockRemoved([7]))
    assert index.match(keys) == 1
    index.apply(BlockRemoved([7]))
    assert index.match(keys) == 0
    assert index.copies == 0


def test_blocks_after_an_unknown_parent_are_skipped_and_counted() -> None:
    index = EngineIndex()
    assert index.apply(stored([2], 99, [5, 6, 7, 8])) is False
    assert (len(index), index.unknown_parents) == (0, 1)
    index.apply(BlockRemoved([12345]))
    assert index.unknown_removals == 1


def test_a_chain_matches_only_up_to_its_first_missing_block() -> None:
    index = EngineIndex()
    index.apply(stored([1, 2, 3], None, list(range(12))))
    keys = block_keys(list(range(16)), BLOCK, None)
    assert index.match(keys) == 3
    index.apply(BlockRemoved([2]))
    assert index.match(keys) == 1
    assert index.match(block_keys([9, *range(1, 16)], BLOCK, None)) == 0


def test_adapters_salts_and_bare_lora_ids_key_blocks_apart() -> None:
    tokens = [1, 2, 3, 4]
    index = EngineIndex()
    index.apply(stored([1], None, tokens, lora_name="sql", extra_keys=[("sql",)]))
    index.apply(stored([2], None, tokens, extra_keys=[("salt-1",)]))
    index.apply(stored([3], None, tokens, lora_id=3))
    assert index.match(block_keys(tokens, BLOCK, "sql")) == 1
    assert index.match(block_keys(tokens, BLOCK, None)) == 0
    assert index.match(block_keys(tokens, BLOCK, "salt-1")) == 0
    assert len(index) == 3


def test_more_copies_than_the_engine_can_hold_is_an_overflow() -> None:
    index = EngineIndex(capacity=2)
    index.apply(stored([1, 2], None, list(range(8))))
    assert not index.overflowing
    index.apply(stored([3], 2, [8, 9, 10, 11]))
    assert index.overflowing
    index.apply(AllBlocksCleared())
    assert (len(index), index.copies, index.overflowing) == (0, 0, False)


_TOKENS = st.lists(st.integers(0, 3), min_size=BLOCK, max_size=3 * BLOCK)


@st.composite
def streams(draw: st.DrawFn) -> list[KvEvent]:
    """Random events over a few hashes: stores chained to known or unknown parents, duplicate
    stores, evictions of held and unknown hashes, clears."""
    events: list[KvEvent] = []
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["store", "store", "store", "remove", "clear"]))
        if kind == "store":
            tokens = draw(_TOKENS)
            blocks = len(tokens) // BLOCK
            hashes: list[BlockHash] = [draw(st.integers(0, 12)) for _ in range(blocks)]
            parent = draw(st.none() | st.integers(0, 14))
            lora = draw(st.sampled_from([None, "a"]))
            events.append(stored(hashes, parent, tokens[: blocks * BLOCK], lora_name=lora))
        elif kind == "remove":
            events.append(BlockRemoved([draw(st.integers(0, 14))]))
        else:
            events.append(AllBlocksCleared())
    return events


@settings(max_examples=300, deadline=None)
@given(streams())
def test_any_event_stream_indexes_as_the_model_says(events: list[KvEvent]) -> None:
    index, model = EngineIndex(), PrefixModel()
    for event in events:
        if isinstance(event, BlockStored) and _impossible(event, model):
            continue
        index.apply(event)
        model.apply(event)
        agree(index, model, BLOCK)
        assert index.copies == sum(model.copies.values())


def _impossible(event: BlockStored, model: PrefixModel) -> bool:
    """A store no engine sends: one hash naming two blocks, or a sequence changing adapter."""
    if event.parent_block_hash is not None and event.parent_block_hash not in model.prefix_of:
        return False
    if event.parent_block_hash is None:
        start: tuple[int, ...] = ()
    else:
        parent_lora, start = model.prefix_of[event.parent_block_hash]
        if parent_lora != event.lora_name:
            return True
    for position, block_hash in enumerate(event.block_hashes):
        tokens = (*start, *event.token_ids[: (position + 1) * BLOCK])
        held = model.prefix_of.get(block_hash)
        if held is not None and held != (event.lora_name, tokens):
            return True
    return len(set(event.block_hashes)) != len(event.block_hashes)


def test_hints_kept_after_lost_batches_count_until_dropped() -> None:
    index = EngineIndex()
    index.apply(stored([1, 2, 3], None, list(range(12))))
    keys = block_keys(list(range(12)), BLOCK, None)
    index.keep_as_hints()
    assert (len(index), index.copies, index.hints, index.match(keys)) == (0, 0, 3, 3)
    index.drop_hints()
    assert index.match(keys) == 0


def test_a_block_stored_after_a_hint_makes_the_hint_and_its_ancestors_held_again() -> None:
    index = EngineIndex()
    index.apply(stored([1, 2, 3], None, list(range(12))))
    index.keep_as_hints()
    assert index.apply(stored([4], 3, [12, 13, 14, 15]))
    assert (len(index), index.hints) == (2, 2)
    assert index.tidy(1) == 1
    assert (len(index), index.hints) == (3, 1)
    index.tidy(100)
    index.drop_hints()
    assert index.match(block_keys(list(range(16)), BLOCK, None)) == 4
    assert (len(index), index.copies, index.unknown_parents) == (4, 4, 0)


def test_a_removed_hint_is_gone_and_a_clear_forgets_hints_too() -> None:
    index = EngineIndex()
    index.apply(stored([1, 2], None, list(range(8))))
    index.keep_as_hints()
    index.apply(BlockRemoved([2]))
    assert (index.match(block_keys(list(range(8)), BLOCK, None)), index.unknown_removals) == (1, 0)
    index.apply(AllBlocksCleared())
    assert (index.hints, index.match(block_keys(list(range(8)), BLOCK, None))) == (0, 0)


def _allocations(action: Callable[[], object]) -> int:
    """Objects allocated (positive) or freed (negative) while `action` ran: the work it did
    on the index's entries, whatever the machine's speed."""
    gc.collect()
    gc.disable()
    try:
        before = sys.getallocatedblocks()
        action()
        return sys.getallocatedblocks() - before
    finally:
        gc.enable()


LONG = 50_000
"""Blocks in one long chain: far more than any O(1) step allocates or frees."""


def _one_long_chain() -> EngineIndex:
    index = EngineIndex()
    index.apply(BlockStored(list(range(1, LONG + 1)), None, list(range(LONG)), 1))  # type: ignore[arg-type]
    return index


def test_keeping_as_hints_dropping_and_clearing_do_not_walk_the_index() -> None:
    """Issue 17, finding 3: a 12-byte gap made the loop copy 3 million blocks into hints."""
    index = _one_long_chain()
    for step in (index.keep_as_hints, index.keep_as_hints, index.drop_hints, index.clear):
        index.apply(BlockStored([LONG + 1], None, [0], 1))
        assert abs(_allocations(step)) < 100, step.__name__


def test_a_block_stored_after_a_long_hinted_chain_confirms_it_in_bounded_steps() -> None:
    """Issue 17, finding 3: a 127-byte store whose parent was a hint walked the whole chain."""
    index = _one_long_chain()
    index.keep_as_hints()
    store = BlockStored([LONG + 1], LONG, [LONG], 1)
    assert abs(_allocations(lambda: index.apply(store))) < 100
    steps = 0
    while index.tidy(1000):
        steps += 1
        assert steps <= LONG // 1000 + 1
    index.drop_hints()
    assert index.match(block_keys(list(range(LONG + 1)), 1, None)) == LONG + 1


def test_what_an_index_drops_is_freed_in_steps_of_a_bounded_size() -> None:
    index = _one_long_chain()
    index.clear()
    assert index.charged == LONG
    freed = []
    while index.deferred:
        freed.append(-_allocations(lambda: index.tidy(5000)))
        assert len(freed) <= 2 * LONG // 5000
    assert index.charged == 0
    assert max(freed) < 5000 * 2
    assert sum(freed) > LONG


def test_an_index_keeps_a_block_in_block_bytes_at_most_and_charges_that() -> None:
    """Issue 17, finding 4: about 290 MiB per million blocks (the wire sends 6 bytes each)."""
    blocks = 100_000
    index = EngineIndex()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for start in range(0, blocks, 16):
            hashes = [(start + n) * 0x9E3779B97F4A7C15 for n in range(16)]
            index.apply(BlockStored(hashes, None, list(range(start, start + 256)), 16))  # type: ignore[arg-type]
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept / blocks <= 192
    assert kept <= index.charged * BLOCK_BYTES


def test_an_index_stops_adding_at_its_limit_and_counts_hints_against_it() -> None:
    index = EngineIndex(limit=6)
    index.apply(stored([1, 2, 3, 4], None, list(range(16))))
    index.apply(stored([5, 6, 7], 4, list(range(16, 28))))
    keys = block_keys(list(range(28)), BLOCK, None)
    assert (len(index), index.match(keys), index.refused) == (6, 6, 1)
    index.keep_as_hints()
    index.apply(stored([8], None, [9, 9, 9, 9]))
    assert (len(index), index.hints, index.refused, index.charged) == (0, 6, 2, 6)
    index.apply(stored([9], 4, list(range(16, 20))))  # no room to hold its parent again
    assert (index.hints, index.refused, index.match(keys)) == (6, 3, 6)
    index.apply(BlockRemoved([1]))
    assert index.match(keys) == 0
    index.drop_hints()
    while index.tidy(100):
        pass
    index.apply(stored([8], None, [9, 9, 9, 9]))
    assert (len(index), index.charged, index.refused) == (1, 1, 3)


def test_hints_all_confirmed_are_still_charged_until_dropped_then_freed() -> None:
    """Their tables keep their size: dropping them hands the charge to `tidy`."""
    index = EngineIndex()
    index.apply(stored([1, 2], None, list(range(8))))
    index.keep_as_hints()
    index.apply(stored([3], 2, [8, 9, 10, 11]))
    while index.tidy(100):
        pass
    assert (index.hints, index.keeps_hints, len(index), index.charged) == (0, True, 3, 5)
    index.drop_hints()
    while index.tidy(100):
        pass
    assert (index.keeps_hints, index.charged) == (False, 3)
