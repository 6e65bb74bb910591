"""A batch too large to apply in one go, cut into slices that together mean exactly what it meant.

Whoever applies a batch pays per block (a stored block's key hashes its
tokens) and per event, and a batch's size is the publisher's choice: one
frame can hold millions of blocks. `slices` cuts a batch into consecutive
batches of bounded work, so the applier can let others run in between:

- events are packed in order, each counting its blocks (at least one) and
  the tokens it hashes;
- a `BlockStored` with more than a slice holds becomes several, each
  chained to the last block of the one before (`parent_block_hash`), with
  its share of `token_ids` and `extra_keys`: an index keys every block from
  its parent's key, its tokens and its extra keys, so the chain of slices
  gives every block the key the whole event gave it;
- a `BlockRemoved` with many hashes becomes several removals.

A single block whose tokens exceed a slice's tokens is a slice of its own:
it cannot be cut, and the frame size bounds it.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from headcount.kvevents.events import BlockRemoved, BlockStored, EventBatch, KvEvent

__all__ = ["SliceBound", "event_blocks", "slices"]


class SliceBound(msgspec.Struct, frozen=True):
    """The most work one slice may hold."""

    blocks: int
    """Blocks stored or removed, an event without blocks counting one."""
    tokens: int
    """Token ids hashed into stored blocks' keys."""


def event_blocks(event: KvEvent) -> int:
    """The blocks an event stores or removes, at least one: what applying it costs."""
    if isinstance(event, BlockStored | BlockRemoved):
        return max(1, len(event.block_hashes))
    return 1


def slices(batch: EventBatch, bound: SliceBound) -> Iterator[EventBatch]:
    """`batch` as consecutive batches within `bound` (itself, when it fits)."""
    if _fits(batch, bound):
        yield batch
        return
    events: list[KvEvent] = []
    blocks = tokens = 0
    for piece in _pieces(batch.events, bound):
        piece_blocks, piece_tokens = event_blocks(piece), _tokens(piece)
        if events and (
            blocks + piece_blocks > bound.blocks or tokens + piece_tokens > bound.tokens
        ):
            yield EventBatch(batch.ts, events, batch.data_parallel_rank)
            events, blocks, tokens = [], 0, 0
        events.append(piece)
        blocks += piece_blocks
        tokens += piece_tokens
    if events:
        yield EventBatch(batch.ts, events, batch.data_parallel_rank)


def _fits(batch: EventBatch, bound: SliceBound) -> bool:
    blocks = tokens = 0
    for event in batch.events:
        blocks += event_blocks(event)
        tokens += _tokens(event)
        if blocks > bound.blocks or tokens > bound.tokens:
            return False
    return True


def _tokens(event: KvEvent) -> int:
    """Tokens hashed to apply `event`: its blocks' shares of `token_ids`, which may be short."""
    if isinstance(event, BlockStored):
        return min(len(event.token_ids), len(event.block_hashes) * max(event.block_size, 0))
    return 0


def _pieces(events: list[KvEvent], bound: SliceBound) -> Iterator[KvEvent]:
    """Every event, those larger than one slice cut into pieces that each fit."""
    for event in events:
        if isinstance(event, BlockStored):
            per_piece = max(1, min(bound.blocks, bound.tokens // max(event.block_size, 1)))
            yield from _stored_pieces(event, per_piece)
        elif isinstance(event, BlockRemoved) and len(event.block_hashes) > bound.blocks:
            hashes = event.block_hashes
            for start in range(0, len(hashes), bound.blocks):
                yield msgspec.structs.replace(
                    event, block_hashes=hashes[start : start + bound.blocks]
                )
        else:
            yield event


def _stored_pieces(event: BlockStored, per_piece: int) -> Iterator[BlockStored]:
    hashes = event.block_hashes
    if len(hashes) <= per_piece:
        yield event
        return
    size, extras = event.block_size, event.extra_keys
    parent = event.parent_block_hash
    for start in range(0, len(hashes), per_piece):
        end = min(start + per_piece, len(hashes))
        yield msgspec.structs.replace(
            event,
            block_hashes=hashes[start:end],
            parent_block_hash=parent,
            token_ids=event.token_ids[start * size : end * size],
            extra_keys=None if extras is None else extras[start:end],
            lookahead_token_ids=event.lookahead_token_ids if end == len(hashes) else None,
        )
        parent = hashes[end - 1]
