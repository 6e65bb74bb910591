"""The two ways vLLM lays out a KV-event batch in msgpack, encoded exactly and decoded alike.

- `"0.10"` (vLLM up to 0.10): every event is an array, tag first:
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id]`,
  `["BlockRemoved", block_hashes]`, `["AllBlocksCleared"]`; hashes are ints.
- `"current"` (vLLM 0.11 on; checked against 0.33): every event is a map whose
  first key is `"type"`, its other keys in declaration order, optional ones
  left out while None; `lora_id`, `medium` and `lora_name` always present.

Both wrap the events in the array `[ts, events, data_parallel_rank]`.
`encode_batch` writes the bytes vLLM's own msgspec encoder writes for that
layout (the shared fixtures check it byte for byte). `decode_batch` reads
either layout, per event, and tolerates what a subscriber meets in practice:
unknown map keys, trailing array items, batches of two items (no rank), and
hashes that are ints, negative ints or bytes.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

from headcount.kvevents.errors import KvEventDecodeError
from headcount.kvevents.events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
)

__all__ = [
    "LAYOUTS",
    "Layout",
    "RawBatch",
    "decode_batch",
    "decode_events",
    "encode_batch",
    "split_batch",
]

Layout = Literal["0.10", "current"]
LAYOUTS: tuple[Layout, ...] = get_args(Layout)


# ---------------------------------------------------------------- vLLM 0.10: tagged arrays


class _Event010(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """vLLM 0.10's `KVCacheEvent`: an array, its tag first."""


class _Stored010(_Event010, tag="BlockStored"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class _Removed010(_Event010, tag="BlockRemoved"):
    block_hashes: list[BlockHash]


class _Cleared010(_Event010, tag="AllBlocksCleared"):
    pass


_Wire010 = _Stored010 | _Removed010 | _Cleared010

# ---------------------------------------------------------------- current: tagged maps


class _StoredCurrent(BlockStored, frozen=True, tag="BlockStored"):
    """vLLM 0.33's `BlockStored` exactly: these three are required there, so always sent.

    msgspec sizes a struct's map header by its declared field count, so even
    the fields never sent must be declared (they are, inherited) for the
    bytes to match vLLM's. Redeclared fields keep their place.
    """

    lora_id: int | None
    medium: str | None
    lora_name: str | None


class _RemovedCurrent(BlockRemoved, frozen=True, tag="BlockRemoved"):
    medium: str | None


class _WireBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The batch as encoded: its events already in a layout's wire structs."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class RawBatch(msgspec.Struct, array_like=True, gc=False):
    """A batch as first decoded (`split_batch`): each event left raw until `decode_events`."""

    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()
_raw_batch = msgspec.msgpack.Decoder(RawBatch)
_current_event = msgspec.msgpack.Decoder(KvEvent)
_event_010 = msgspec.msgpack.Decoder(_Wire010)


def encode_batch(batch: EventBatch, layout: Layout) -> bytes:
    """The msgpack bytes vLLM of that `layout` publishes for `batch`.

    The 0.10 layout carries no `medium`, `lora_name` or later fields; they are
    dropped. Hashes are written as given (0.10 expects ints).
    """
    to_wire = _to_010 if layout == "0.10" else _to_current
    wire = _WireBatch(
        batch.ts, [to_wire(event) for event in batch.events], batch.data_parallel_rank
    )
    return _encoder.encode(wire)


def decode_batch(payload: bytes) -> EventBatch:
    """The batch in `payload`, whichever layout each of its events is in."""
    raw = split_batch(payload)
    return EventBatch(raw.ts, decode_events(raw.events), raw.data_parallel_rank)


def split_batch(payload: bytes) -> RawBatch:
    """The batch in `payload`, its events still raw: `decode_events` reads them, as many at
    a time as the caller likes, since a batch of a hundred thousand events is one frame."""
    try:
        return _raw_batch.decode(payload)
    except (msgspec.MsgspecError, RecursionError) as exc:
        raise KvEventDecodeError(f"not a KV-event batch: {type(exc).__name__}: {exc}") from None


def decode_events(raw: list[msgspec.Raw]) -> list[KvEvent]:
    """Raw events of a batch, whichever layout each is in.

    Values nested deeper than the interpreter's recursion limit (`extra_keys` may hold
    anything) and blocks of fewer than one token are no event any engine sends.
    """
    try:
        return [_decode_event(event) for event in raw]
    except (msgspec.MsgspecError, RecursionError) as exc:
        raise KvEventDecodeError(f"not a KV event: {type(exc).__name__}: {exc}") from None


def _decode_event(raw: msgspec.Raw) -> KvEvent:
    head = memoryview(raw)[0]
    event: KvEvent
    if 0x80 <= head <= 0x8F or head in (0xDE, 0xDF):  # a map: the current layout
        event = _current_event.decode(raw)
    elif 0x90 <= head <= 0x9F or head in (0xDC, 0xDD):  # an array: vLLM 0.10
        event = _from_010(_event_010.decode(raw))
    else:
        raise KvEventDecodeError(f"a KV event must be a map or an array, not msgpack 0x{head:02x}")
    if isinstance(event, BlockStored) and event.block_size < 1:
        raise KvEventDecodeError(f"a block holds at least one token, not {event.block_size}")
    return event


def _from_010(event: _Wire010) -> KvEvent:
    if isinstance(event, _Stored010):
        return BlockStored(
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            lora_id=event.lora_id,
        )
    if isinstance(event, _Removed010):
        return BlockRemoved(event.block_hashes)
    return AllBlocksCleared()


def _to_010(event: KvEvent) -> _Wire010:
    if isinstance(event, BlockStored):
        return _Stored010(
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
        )
    if isinstance(event, BlockRemoved):
        return _Removed010(event.block_hashes)
    return _Cleared010()


def _to_current(event: KvEvent) -> _StoredCurrent | _RemovedCurrent | AllBlocksCleared:
    if isinstance(event, BlockStored):
        return _StoredCurrent(*msgspec.structs.astuple(event))
    if isinstance(event, BlockRemoved):
        return _RemovedCurrent(*msgspec.structs.astuple(event))
    return event
