"""The engine's KV-event publisher: vLLM's `ZmqEventPublisher` on asyncio, with stream faults.

Routers that track what each engine's prefix cache holds subscribe to this,
so it behaves as vLLM's does (`vllm/distributed/kv_events.py`):

- The prefix cache reports through `KvEventSink`; the events of one scheduler
  step (`end_step`) form one batch, and steps without events send nothing.
- Each batch gets the next sequence number, from 0, and goes out on a PUB
  socket as `[topic, seq, payload]` (`headcount.kvevents` has the layouts).
  A PUB socket never waits: vLLM's high-water mark of 100,000 messages per
  subscriber, then drops.
- The last `buffer_steps` batches stay in a buffer; a ROUTER socket answers a
  DEALER's `[b"", start_seq]` with every buffered batch from `start_seq` on,
  then the end marker. A request of any other shape gets no answer at all.
- Block hashes are the cache's unsigned 64-bit ints; in the 0.10 layout they
  go out as the signed ints of the same bits, as vLLM 0.10's default
  `builtin` hash (Python's `hash()`) made them, so some are negative. LoRA
  adapters get ids 1, 2, ... in the order they are first seen, as vLLM
  numbers adapters as it loads them; in the current layout `BlockStored` also
  carries `group_idx: 0` and one `extra_keys` entry per block (the adapter's
  name, or null), and `BlockRemoved` carries `group_idx: 0`, as a 0.33 engine's do.

Faults (`faults`, and `restart`, `resize_replay_buffer`), for subscribers' tests:

- `drop = N`: the next N batches are numbered and kept for replay, but not
  sent, as when a PUB socket drops at its high-water mark: a gap replay can fill.
- `silent`: no batch is sent while set; they are still numbered and kept.
- `replay = False`: replay requests are read and left unanswered.
- `restart()`: as if the engine restarted: the cache is emptied through
  `reset_cache` with no `AllBlocksCleared` (vLLM sends none at startup),
  events not yet sent are lost, the sequence starts again at 0 and the replay
  buffer is empty. The sockets stay bound, so subscribers stay connected.
- `resize_replay_buffer(n)`: keep only the newest `n` batches from now on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from headcount.kvevents import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    encode_batch,
    pub_frames,
    replay_end,
    replay_reply,
)
from headcount.sim.engine.kv_events_config import KvEventsConfig
from headcount.sim.engine.kv_sink import KvEventSink

__all__ = ["HWM", "KvEventFaults", "KvEventPublisher"]

_log = logging.getLogger(__name__)

HWM = 100_000
"""vLLM's default PUB high-water mark, in messages per subscriber."""
_DP_RANK = 0
"""The data-parallel rank written into every batch: one engine, rank 0."""
_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1


@dataclass
class KvEventFaults:
    """What is wrong with the event stream now; `/sim/kv-events` sets it."""

    drop: int = 0
    """Batches still to number and keep for replay, but not send."""
    silent: bool = False
    """Send no batch while set (they are still numbered and kept for replay)."""
    replay: bool = True
    """Answer replay requests; False reads and ignores them."""

    def withhold(self) -> bool:
        """Whether the batch about to go out must not be sent, counting a drop."""
        if self.silent:
            return True
        if self.drop:
            self.drop -= 1
            return True
        return False


class KvEventPublisher(KvEventSink):
    """A `KvEventSink` whose steps become batches on vLLM's PUB and replay sockets."""

    def __init__(self, config: KvEventsConfig, host: str, reset_cache: Callable[[], None]) -> None:
        self.config = config
        self.faults = KvEventFaults()
        self.endpoint = ""
        """The PUB socket's bound endpoint, `tcp://host:port`, once started."""
        self.replay_endpoint: str | None = None
        self.sent = 0
        self.withheld = 0
        self.replays_answered = 0
        self.replays_ignored = 0
        self._host = host
        self._reset_cache = reset_cache
        self._topic = config.topic.encode()
        self._pending: list[KvEvent] = []
        self._batches: asyncio.Queue[EventBatch] = asyncio.Queue()
        self._next_seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._lora_ids: dict[str, int] = {}
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ---------------------------------------------------------------- the sink

    def stored(
        self,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None,
    ) -> None:
        hashes: list[BlockHash] = [self._wire_hash(h) for h in block_hashes]
        lora_id = None
        if lora_name is not None:
            lora_id = self._lora_ids.setdefault(lora_name, len(self._lora_ids) + 1)
        parent = None if parent_block_hash is None else self._wire_hash(parent_block_hash)
        extra_key = None if lora_name is None else (lora_name,)
        self._pending.append(
            BlockStored(
                hashes,
                parent,
                list(token_ids),
                block_size,
                lora_id=lora_id,
                medium=MEDIUM_GPU,
                lora_name=lora_name,
                extra_keys=[extra_key] * len(hashes),
                group_idx=0,
            )
        )

    def removed(self, block_hashes: Sequence[int]) -> None:
        """One event per block, as vLLM evicts them."""
        for block_hash in block_hashes:
            event = BlockRemoved([self._wire_hash(block_hash)], medium=MEDIUM_GPU, group_idx=0)
            self._pending.append(event)

    def cleared(self) -> None:
        self._pending.append(AllBlocksCleared())

    def end_step(self) -> None:
        if self._pending:
            self._batches.put_nowait(EventBatch(time.time(), self._pending, _DP_RANK))
            self._pending = []

    # ---------------------------------------------------------------- faults

    def restart(self) -> None:
        """As if the engine restarted: cache emptied silently, unsent events lost,
        sequence from 0, replay buffer empty."""
        self._reset_cache()
        self._pending = []
        while not self._batches.empty():
            self._batches.get_nowait()
        self._next_seq = 0
        self._buffer.clear()

    def resize_replay_buffer(self, steps: int) -> None:
        """Keep the newest `steps` batches for replay, from now on."""
        self._buffer = deque(self._buffer, maxlen=steps)

    def status(self) -> dict[str, object]:
        """The stream's position, buffer and faults: the body of `/sim/kv-events`."""
        return {
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
            "format": self.config.layout,
            "topic": self.config.topic,
            "queued": self._batches.qsize(),
            "next_seq": self._next_seq,
            "sent": self.sent,
            "withheld": self.withheld,
            "buffered": len(self._buffer),
            "oldest_buffered": self._buffer[0][0] if self._buffer else None,
            "replay_buffer": self._buffer.maxlen,
            "drop": self.faults.drop,
            "silent": self.faults.silent,
            "replay": self.faults.replay,
            "replays_answered": self.replays_answered,
            "replays_ignored": self.replays_ignored,
        }

    # ---------------------------------------------------------------- sockets

    def start(self) -> None:
        """Bind the sockets on the engine's host and start publishing."""
        context = zmq.asyncio.Context.instance()
        self._pub = context.socket(zmq.PUB)
        self._pub.set_hwm(HWM)
        self.endpoint = _bind(self._pub, self._host, self.config.port)
        if self.config.replay_port is not None:
            self._replay = context.socket(zmq.ROUTER)
            # As vLLM 0.33: a whole replay and its end marker always fit.
            self._replay.setsockopt(zmq.SNDHWM, 2 * (self.config.buffer_steps + 1))
            self.replay_endpoint = _bind(self._replay, self._host, self.config.replay_port)
            self._tasks.append(asyncio.create_task(self._serve_replay(self._replay)))
        self._tasks.append(asyncio.create_task(self._send_batches(self._pub)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for socket in (self._pub, self._replay):
            if socket is not None:
                socket.close(linger=0)

    async def _send_batches(self, pub: zmq.asyncio.Socket) -> None:
        while True:
            batch = await self._batches.get()
            seq = self._next_seq
            self._next_seq += 1
            payload = encode_batch(batch, self.config.layout)
            self._buffer.append((seq, payload))
            if self.faults.withhold():
                self.withheld += 1
                continue
            try:
                await pub.send_multipart(pub_frames(self._topic, seq, payload))
            except zmq.ZMQError as exc:  # the seq is spent, as in vLLM (the batch stays buffered)
                _log.warning("KV-event batch %d not sent: %s", seq, exc)
            else:
                self.sent += 1

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if not self.faults.replay:
                self.replays_ignored += 1
            elif len(frames) != 3:
                _log.warning("invalid KV-event replay request: %d frames", len(frames))
            else:
                try:
                    await self._answer_replay(router, *frames)
                except zmq.ZMQError as exc:
                    _log.warning("KV-event replay not answered: %s", exc)

    async def _answer_replay(
        self, router: zmq.asyncio.Socket, identity: bytes, delimiter: bytes, start: bytes
    ) -> None:
        layout = self.config.layout
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):  # a copy: sending may let batches in
            if seq >= start_seq:
                reply = replay_reply(layout, self._topic, seq, payload)
                await router.send_multipart([identity, *reply])
        await router.send_multipart([identity, *replay_end(layout)])
        self.replays_answered += 1

    def _wire_hash(self, block_hash: int) -> int:
        if self.config.layout == "0.10" and block_hash > _I64_MAX:
            return block_hash - _U64
        return block_hash


def _bind(socket: zmq.asyncio.Socket, host: str, port: int) -> str:
    """Bind `tcp://host:port` (0: a free port); the endpoint actually bound."""
    if ":" in host:
        socket.setsockopt(zmq.IPV6, 1)
        host = f"[{host}]"
    socket.bind(f"tcp://{host}:{port}")
    endpoint: str = socket.getsockopt_string(zmq.LAST_ENDPOINT)
    return endpoint
