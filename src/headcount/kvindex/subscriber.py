"""One engine's KV-event subscriber: vLLM's event stream read as a watch that must not miss a batch.

A ZMQ PUB drops silently past its high-water mark, a subscriber that
reconnects misses what was sent meanwhile, and a restarted engine counts
again from 0; the sequence number in every frame is what reveals each case.
`EventSubscriber` reads the engine's PUB socket and tells its `StreamSink`
only what the index must act on (docs/RESEARCH-kv-events.md §6(b)):

- the next batch in sequence (`batch`);
- a gap (`gap`), which it asks the engine's replay socket to fill, on a new
  DEALER per replay, within `replay_timeout` for the whole replay, buffering
  live batches meanwhile (bounded) and applying them deduplicated after;
  a replay that starts later than asked, does not answer or ends short is
  `replayed(False)` then `clear(GAP)`, and the stream continues from the live
  batch, the index rebuilding from there;
- a sequence that goes backwards (a new engine process): `clear(RESTART)`,
  then the stream starts afresh; a first batch after 0 (a late joiner) is a
  gap from 0, which the replay may fill;
- whether the SUB socket holds a ZMTP session with the publisher, from a
  socket monitor (`connected`, on change only). A completed handshake, not a
  TCP connect, counts as connected, so a port held by something else is not a
  publisher; heartbeats make a silently dead peer count as disconnected.

Reconnecting is ZMQ's own. Every message is awaited through a poller, which
lets the loop run between any two, so a burst of batches never starves it.
A frame that does not decode is logged (rate limited), counted, and is a
missed batch: the next one reveals the gap.
Data-parallel engines are left out: one subscriber per engine, on rank 0's
port, and batches of another rank are ignored and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from headcount.kvevents import (
    END_SEQ,
    EventBatch,
    KvEventDecodeError,
    decode_batch,
    frame_seq,
    parse_replay_reply,
    replay_request,
)
from headcount.kvindex.stream import ClearReason, StreamSink, SubscriberTarget

__all__ = ["EventSubscriber", "SubscriberCounts"]

_log = logging.getLogger(__name__)

_UP_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
_RANK = 0
"""The data-parallel rank whose batches are applied."""
_DECODE_LOG_INTERVAL = 60.0
"""Seconds between two log lines about undecodable frames from one engine."""


@dataclass
class SubscriberCounts:
    """What one subscriber met that its sink is not told: for metrics and tests."""

    undecodable: int = 0
    """Frames (live or replayed) that were not a KV-event batch."""
    other_rank: int = 0
    """Batches of a data-parallel rank other than 0, ignored."""
    replays: int = 0
    """Replays asked for."""
    held_dropped: int = 0
    """Live batches dropped because too many arrived during one replay."""


class _ReplayFailed(Exception):
    """The replay cannot fill the gap (it says why)."""


class EventSubscriber:
    """Reads one engine's KV-event stream into `sink`, from one task, until cancelled."""

    def __init__(
        self,
        target: SubscriberTarget,
        sink: StreamSink,
        *,
        context: zmq.asyncio.Context | None = None,
        reconnect_ivl: float = 0.1,
        reconnect_ivl_max: float = 5.0,
        heartbeat_ivl: float = 2.0,
        heartbeat_timeout: float = 6.0,
        held_limit: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.counts = SubscriberCounts()
        self._sink = sink
        self._context = context or zmq.asyncio.Context.instance()
        self._options = {
            zmq.RECONNECT_IVL: round(reconnect_ivl * 1000),
            zmq.RECONNECT_IVL_MAX: round(reconnect_ivl_max * 1000),
            zmq.HEARTBEAT_IVL: round(heartbeat_ivl * 1000),
            zmq.HEARTBEAT_TIMEOUT: round(heartbeat_timeout * 1000),
            zmq.LINGER: 0,
        }
        self._clock = clock
        self._connected = False
        self._last: int | None = None
        """The seq of the last batch passed on (or skipped by rank); None: a fresh start."""
        self._live: int | None = None
        """The seq of the last live frame read, applied or not: restarts show against it."""
        self._held: deque[list[bytes]] = deque(maxlen=held_limit)
        self._decode_logged_at: float | None = None

    async def run(self) -> None:
        """Subscribe and feed the sink until cancelled; sockets are closed with linger 0."""
        sub = self._context.socket(zmq.SUB)
        monitor: zmq.asyncio.Socket | None = None
        try:
            for option, value in self._options.items():
                sub.setsockopt(option, value)
            sub.setsockopt(zmq.SUBSCRIBE, self.target.topic.encode())
            monitor = sub.get_monitor_socket(_UP_EVENTS | _DOWN_EVENTS)
            sub.connect(self.target.endpoint)
            await self._follow(sub, monitor)
        finally:
            if monitor is not None:
                sub.disable_monitor()
                monitor.close(linger=0)
            sub.close(linger=0)

    async def _follow(self, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while True:
            while self._held:
                await self._on_live(self._held.popleft(), sub, monitor)
                await asyncio.sleep(0)  # held frames skip the poller, which would yield
            ready = dict(await poller.poll())
            if monitor in ready:
                self._on_monitor(await monitor.recv_multipart())
            if sub in ready:
                await self._on_live(await sub.recv_multipart(), sub, monitor)

    # ---------------------------------------------------------------- connection

    def _on_monitor(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        up = bool(event & _UP_EVENTS)
        if up == self._connected:
            return
        self._connected = up
        if up:
            _log.info("KV events from %s: connected", self.target.endpoint)
        else:
            _log.warning("KV events from %s: disconnected", self.target.endpoint)
        self._sink.connected(up)

    # ---------------------------------------------------------------- the sequence

    async def _on_live(
        self, frames: list[bytes], sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket
    ) -> None:
        try:
            if len(frames) != 3:
                raise KvEventDecodeError(f"a live message has 3 frames, not {len(frames)}")
            seq = frame_seq(frames[1])
        except KvEventDecodeError as exc:
            self._undecodable(exc)
            return
        if self._live is not None and seq <= self._live:
            _log.warning(
                "KV events from %s: sequence went back from %d to %d, the engine restarted",
                self.target.endpoint,
                self._live,
                seq,
            )
            self._sink.clear(ClearReason.RESTART)
            self._last = None
        self._live = seq
        try:
            batch = decode_batch(frames[2])
        except KvEventDecodeError as exc:
            self._undecodable(exc)  # a missed batch: the next one shows the gap
            return
        await self._sequence(seq, batch, sub, monitor)

    async def _sequence(
        self,
        seq: int,
        batch: EventBatch,
        sub: zmq.asyncio.Socket,
        monitor: zmq.asyncio.Socket,
    ) -> None:
        last = self._last
        if last is not None and seq <= last:
            return  # already replayed
        expected = 0 if last is None else last + 1
        if seq == expected:
            self._deliver(seq, batch)
            return
        _log.info(
            "KV events from %s: batches %d..%d missed, asking for a replay",
            self.target.endpoint,
            expected,
            seq - 1,
        )
        self._sink.gap(expected, seq)
        try:
            await self._replay(expected, seq, sub, monitor)
        except _ReplayFailed as failure:
            _log.warning(
                "KV events from %s: replay from %d failed (%s); index cleared, rebuilding",
                self.target.endpoint,
                expected,
                failure,
            )
            self._sink.replayed(False)
            self._sink.clear(ClearReason.GAP)
            self._last = None
        else:
            _log.info("KV events from %s: replay filled the gap", self.target.endpoint)
            self._sink.replayed(True)
        if self._last is None or seq > self._last:
            self._deliver(seq, batch)

    def _deliver(self, seq: int, batch: EventBatch) -> None:
        self._last = seq
        if batch.data_parallel_rank not in (None, _RANK):
            self.counts.other_rank += 1
            return
        self._sink.batch(seq, batch)

    # ---------------------------------------------------------------- replay

    async def _replay(
        self, start: int, live: int, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket
    ) -> None:
        """Pass on batches `start`..`live - 1` (and any after) from the replay socket, or raise
        `_ReplayFailed`; live frames that arrive meanwhile are held for later."""
        self.counts.replays += 1
        dealer = self._context.socket(zmq.DEALER)  # never reused: a late answer must not
        try:  # confuse the next replay
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.target.replay_endpoint)
            try:
                async with asyncio.timeout(self.target.replay_timeout):
                    await dealer.send_multipart(replay_request(start))
                    await self._read_replay(dealer, sub, monitor)
            except TimeoutError:
                raise _ReplayFailed(f"no answer within {self.target.replay_timeout:g}s") from None
        finally:
            dealer.close(linger=0)
        if self._last is None or self._last < live - 1:
            raise _ReplayFailed(f"it ended at {self._last}, before {live - 1}")

    async def _read_replay(
        self, dealer: zmq.asyncio.Socket, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket
    ) -> None:
        poller = zmq.asyncio.Poller()
        for socket in (dealer, sub, monitor):
            poller.register(socket, zmq.POLLIN)
        while True:
            ready = dict(await poller.poll())
            if monitor in ready:
                self._on_monitor(await monitor.recv_multipart())
            if sub in ready:
                self._hold(await sub.recv_multipart())
            if dealer not in ready:
                continue
            try:
                seq, payload = parse_replay_reply(await dealer.recv_multipart())
                if seq == END_SEQ:
                    return
                batch = decode_batch(payload)
            except KvEventDecodeError as exc:
                self._undecodable(exc)
                raise _ReplayFailed("an undecodable reply") from None
            expected = 0 if self._last is None else self._last + 1
            if seq > expected:  # the engine no longer holds what was missed
                raise _ReplayFailed(f"batch {expected} is not in it (it went on with {seq})")
            if seq == expected:
                self._deliver(seq, batch)

    def _hold(self, frames: list[bytes]) -> None:
        if len(self._held) == self._held.maxlen:
            self.counts.held_dropped += 1  # the oldest goes: a gap the next replay may fill
        self._held.append(frames)

    def _undecodable(self, exc: KvEventDecodeError) -> None:
        self.counts.undecodable += 1
        now = self._clock()
        logged = self._decode_logged_at
        if logged is None or now - logged >= _DECODE_LOG_INTERVAL:
            self._decode_logged_at = now
            _log.warning(
                "KV events from %s: undecodable frame (%d so far): %s",
                self.target.endpoint,
                self.counts.undecodable,
                exc,
            )
