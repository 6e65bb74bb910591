"""The hostile suite's adversarial KV-event publisher: an engine's event stream as an attack.

A router routing `kv-aware` subscribes to every engine's KV events (vLLM's ZMQ
PUB socket) and asks its replay socket for what it missed. Anyone who can run
an engine can send anything there, so each attack binds both sockets where the
router looks for the adversarial engine's (`--kv-endpoint`, `--replay-endpoint`:
the router's `--kv-events-port` and `--kv-events-replay-port` on that engine's
address). The PUB side is an XPUB that waits for the router's subscription
before its first batch (seq 0) and, at its high-water mark, waits instead of
dropping (`XPUB_NODROP`): the router misses nothing it was not meant to miss,
and a flood goes at the pace the router reads it (a backlog of its own would
delay the heartbeats behind it until the router drops the connection). The
replay socket answers every request with the end marker alone: every gap is one
the replay cannot fill. Frames are vLLM's current layout (`headcount.kvevents`).

- `kv-frames`: one stage per size in `sizes_mib`: one batch holding one
  `BlockStored` of block size 1 and 2 bytes per block (a 1-byte hash and a 1-byte
  token id, so `size / 2` blocks). Each stage starts once the router answers
  `/livez` again (and a second more).
- `kv-flood`: small batches (one block stored, then removed, alternately) as fast
  as the router reads them, at most `FLOOD_RATE` a second.
- `kv-index`: stores `blocks` blocks of 1 token as one chain (`FILL_BLOCKS` to a
  batch), polls the router's `/engines` until its index holds them, then sends a
  12-byte batch that skips a sequence number (an empty batch: the gap is the
  attack) and, once the router has cleared the index to hints, a `BlockStored`
  whose parent is the chain's last block, a hint (the router confirms the chain).

Each stage's start is a mark in the summary, so the report can say which stalled
the router.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

import msgspec
import zmq
import zmq.asyncio

from bench.hostile.programs.plan import Marks, Plan, Stats, wait_start
from bench.hostile.rawhttp import ConnectionClosed, RawConnection, get_request
from headcount.kvevents import (
    BlockRemoved,
    BlockStored,
    EventBatch,
    encode_batch,
    replay_end,
    seq_frame,
)

__all__ = ["FILL_BLOCKS", "FLOOD_RATE", "kv_flood", "kv_frames", "kv_index", "two_bytes_per_block"]

MIB = 1024 * 1024
FLOOD_RATE = 50_000
"""Small batches a second at most in the flood."""
FILL_BLOCKS = 5_000
"""Blocks to a batch while filling the index: small frames, the index is what grows."""
_FLOOD_BURST = 500
_POLL_S = 0.5
_FULL_PAUSE_S = 0.001
_STEADY_POLLS = 8
_SETTLE_S = 1.0
"""Between two stages of `kv-index`: the stall of one is not the next one's."""


def _raw_array(items: bytes) -> msgspec.Raw:
    """A msgpack array of positive fixints (each byte < 128), as raw bytes to embed."""
    return msgspec.Raw(b"\xdd" + len(items).to_bytes(4, "big") + items)


def _batch(*events: Any) -> bytes:
    return encode_batch(EventBatch(time.time(), list(events), 0), "current")


def two_bytes_per_block(size: int) -> bytes:
    """One batch, one `BlockStored` of block size 1: `size / 2` blocks, 2 bytes each."""
    blocks = size // 2
    pattern = bytes(range(128))
    items = (pattern * (blocks // 128 + 1))[:blocks]
    stored = BlockStored(
        block_hashes=_raw_array(items),  # type: ignore[arg-type]
        parent_block_hash=None,
        token_ids=_raw_array(items),  # type: ignore[arg-type]
        block_size=1,
    )
    return _batch(stored)


class Publisher:
    """The adversarial engine's PUB (an XPUB: it sees the subscription) and replay sockets."""

    def __init__(self, plan: Plan) -> None:
        self._context = zmq.asyncio.Context()
        self.pub = self._context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_NODROP, 1)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(plan.kv_endpoint)
        self.replay = self._context.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.bind(plan.replay_endpoint)
        self.seq = 0
        self.sent = 0
        self.sent_bytes = 0
        self.replays_asked = 0
        self._answering = asyncio.get_running_loop().create_task(self._answer_replays())

    async def subscribed(self, timeout: float) -> bool:
        """Whether a subscriber's subscription arrived within `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                while not (await self.pub.recv()).startswith(b"\x01"):
                    pass
        except TimeoutError:
            return False
        return True

    async def send(self, payload: bytes, skip: int = 0) -> None:
        """`payload` as the next batch, `skip` sequence numbers after the last one sent."""
        self.seq += skip
        frames = [b"", seq_frame(self.seq), payload]
        while True:  # an XPUB_NODROP socket at its mark says EAGAIN, and POLLOUT all the same
            try:
                await self.pub.send_multipart(frames, flags=zmq.NOBLOCK)
                break
            except zmq.Again:
                await asyncio.sleep(_FULL_PAUSE_S)
        self.seq += 1
        self.sent += 1
        self.sent_bytes += len(payload)

    async def _answer_replays(self) -> None:
        while True:
            identity, *_ = await self.replay.recv_multipart()
            self.replays_asked += 1
            await self.replay.send_multipart([identity, *replay_end("current")])

    def close(self) -> None:
        self._answering.cancel()
        self.pub.close(linger=0)
        self.replay.close(linger=0)
        self._context.term()

    def stats(self) -> Stats:
        return {
            "batches sent": self.sent,
            "MiB sent": round(self.sent_bytes / MIB, 1),
            "replays asked (each answered with the end marker alone)": self.replays_asked,
        }


async def _publishing(plan: Plan, marks: Marks, attack: Any) -> Stats:
    publisher = Publisher(plan)
    try:
        if not await publisher.subscribed(plan.remaining()):
            return {"error": "the router never subscribed", **publisher.stats()}
        await wait_start(plan)
        stats: Stats = await attack(publisher)
        return {**stats, **publisher.stats(), "marks": marks.marks}
    finally:
        publisher.close()


# --- kv-frames --------------------------------------------------------------------------


async def kv_frames(plan: Plan) -> Stats:
    marks = Marks()

    async def attack(publisher: Publisher) -> Stats:
        recovered: list[float] = []
        states: list[str] = []
        for size in plan.sizes_mib:
            payload = two_bytes_per_block(int(size * MIB))
            marks(f"{size:g} MiB frame")
            sent_at = time.monotonic()
            await publisher.send(payload)
            await _responsive(plan)
            recovered.append(round(time.monotonic() - sent_at, 1))
            states.append(_state(await _attacked_index(plan)))
            await asyncio.sleep(min(_SETTLE_S, plan.remaining(0.0)))
        return {
            "seconds until /livez answered after each frame": recovered,
            "index after each frame": states,
        }

    return await _publishing(plan, marks, attack)


async def _responsive(plan: Plan) -> None:
    """Wait (within the attack's time) until the router answers `/livez` again: the next
    stage's stall is then its own. The frame is read at once, so its stall starts first."""
    await asyncio.sleep(_SETTLE_S)
    while plan.running():
        conn: RawConnection | None = None
        try:
            conn = await RawConnection.open(plan.host, plan.port, timeout=plan.remaining())
            await conn.send(get_request("/livez"), plan.remaining())
            await conn.response(plan.remaining())
            return
        except (ConnectionClosed, OSError, TimeoutError):
            await asyncio.sleep(_POLL_S)
        finally:
            if conn is not None:
                conn.abort()


async def kv_flood(plan: Plan) -> Stats:
    marks = Marks()
    stored = _batch(BlockStored(block_hashes=[77], parent_block_hash=None, token_ids=[7],
                                block_size=1))  # fmt: skip
    removed = _batch(BlockRemoved(block_hashes=[77]))

    async def attack(publisher: Publisher) -> Stats:
        marks("flood")
        started, sent = time.monotonic(), 0
        while plan.running():
            for _ in range(_FLOOD_BURST):
                await publisher.send(stored if sent % 2 == 0 else removed)
                sent += 1
            ahead = sent / FLOOD_RATE - (time.monotonic() - started)
            await asyncio.sleep(max(0.0, min(ahead, plan.remaining(0.0))))
        seconds = time.monotonic() - started
        return {
            "flood batches": sent,
            "batches a second": round(sent / seconds),
            "index at the end": _state(await _attacked_index(plan)),
        }

    return await _publishing(plan, marks, attack)


# --- kv-index ---------------------------------------------------------------------------


async def _engines(plan: Plan) -> list[dict[str, Any]]:
    conn: RawConnection | None = None
    try:
        conn = await RawConnection.open(plan.host, plan.port, timeout=2.0, keep=64 * MIB)
        await conn.send(get_request("/engines"), 2.0)
        answer = await conn.response(30.0)
        engines: list[dict[str, Any]] = json.loads(answer.body)["engines"]
    except (ConnectionClosed, OSError, TimeoutError, ValueError, KeyError):
        return []
    finally:
        if conn is not None:
            conn.abort()
    return engines


async def _attacked_index(plan: Plan) -> dict[str, Any]:
    """The `kv_index` of the engine on the publisher's host (the adversarial one)."""
    host = urlsplit(plan.kv_endpoint).hostname
    engines = [e for e in await _engines(plan) if urlsplit(e.get("url", "")).hostname == host]
    return engines[0].get("kv_index") or {} if engines else {}


def _state(index: dict[str, Any]) -> str:
    return f"{index.get('state')} ({index.get('reason')}), {index.get('blocks')} blocks"


async def _until_blocks(plan: Plan, done: Any) -> dict[str, Any]:
    """Poll `/engines` until `done(blocks)` holds, the count has not moved for
    `_STEADY_POLLS` polls (a router that bounds its index stops short), or time is up."""
    index: dict[str, Any] = {}
    seen: list[int] = []
    while plan.running():
        index = await _attacked_index(plan)
        blocks = index.get("blocks") or 0
        seen.append(blocks)
        if done(blocks) or seen[-_STEADY_POLLS:] == [blocks] * _STEADY_POLLS:
            break
        await asyncio.sleep(_POLL_S)
    return index


async def kv_index(plan: Plan) -> Stats:
    marks = Marks()

    async def attack(publisher: Publisher) -> Stats:
        marks("fill")
        for first in range(0, plan.blocks, FILL_BLOCKS):
            hashes = list(range(first + 1, min(first + FILL_BLOCKS, plan.blocks) + 1))
            stored = BlockStored(
                block_hashes=hashes,  # type: ignore[arg-type]
                parent_block_hash=first or None,
                token_ids=[h % 100 for h in hashes],
                block_size=1,
            )
            await publisher.send(_batch(stored))
        filled = await _until_blocks(plan, lambda blocks: blocks >= plan.blocks)
        marks("filled")
        await asyncio.sleep(_SETTLE_S)
        marks("gap frame")
        empty = _batch()
        await publisher.send(empty, skip=1)
        cleared = await _until_blocks(plan, lambda blocks: blocks == 0)
        await asyncio.sleep(_SETTLE_S)
        marks("hint parent")
        stored = BlockStored(
            block_hashes=[plan.blocks + 1],
            parent_block_hash=plan.blocks,
            token_ids=[7],
            block_size=1,
        )
        await publisher.send(_batch(stored))
        confirmed = await _until_blocks(plan, lambda blocks: blocks > plan.blocks)
        marks("confirmed")
        return {
            "blocks stored": plan.blocks,
            "gap frame bytes": len(empty),
            "index when filled": filled,
            "index after the gap": cleared,
            "index after the hint's child": confirmed,
        }

    return await _publishing(plan, marks, attack)
