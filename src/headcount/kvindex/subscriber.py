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
  publisher; heartbeats make a silently dead peer count as disconnected;
- whether the stream is complete, whatever the traffic (`confirmed`,
  `unconfirmed`): a batch in sequence shows it; after `check_interval`
  without one (and at once on connecting), the liveness check asks the
  replay socket for every batch from the last one applied on, on a new
  DEALER, within `replay_timeout`. vLLM's replay answers every buffered batch
  whose seq is at least the one asked for, then the end marker, and it
  buffers a batch as it publishes it, so the answer is exact and, when
  nothing was missed, one batch: the last applied, then the end (confirmed).
  Batches after it were missed (or are on their way): a gap, replayed from
  the answer itself; an answer that starts later than asked is a gap it
  cannot fill; an answer without the last applied batch means the sequence
  went back (a restart with no batch since, or fewer than before): the index
  is cleared and checked again from 0. No answer: `unconfirmed`, logged once
  per change.

Every message is awaited through a poller, which lets the loop run between
any two. What a stream costs is the router's choice, never the engine's: ZMQ
refuses a frame over `max_frame` unread (the subscriber dials
again: a gap) and holds at most 16 per socket; batches are decoded and passed
on in slices of bounded work (`kvevents.slices`), the loop running between;
an engine over its `budget` a second is read later (its publisher drops the
excess: a gap); replays are budgeted, a gap past that is cleared; live frames
held during a replay are bounded in number and bytes (the oldest go: a gap);
a frame that does not decode, whatever the decoder raised, is counted and a
missed batch (the next one reveals the gap), never the end of the task; and
each log line an engine can provoke is rate-limited per kind (`LogLimit`).
Data-parallel engines are left out: one subscriber per engine, on rank 0's
port, and batches of another rank are ignored and counted.

Over 450 lines: the live stream, the replay of a gap and the liveness check
share the sequence (`_last`), the frames held meanwhile and the budgets;
split apart, each would reach into the others' state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from headcount.clock import Clock, Sleep
from headcount.config import KvEventsSettings
from headcount.kvevents import (
    END_SEQ,
    EventBatch,
    KvEvent,
    KvEventDecodeError,
    SliceBound,
    decode_events,
    event_blocks,
    frame_seq,
    parse_replay_reply,
    replay_request,
    slices,
    split_batch,
)
from headcount.kvindex.budget import Budget
from headcount.kvindex.redial import Redial
from headcount.kvindex.stream import ClearReason, StreamSink, SubscriberTarget
from headcount.log_limit import LogLimit

__all__ = ["SLICE", "EventSubscriber", "SubscriberCounts"]

_log = logging.getLogger(__name__)

_UP_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
_RANK = 0
"""The data-parallel rank whose batches are applied."""
_LOG_EVERY = 60.0
"""Seconds between two log lines of one kind about one engine."""
_QUEUED = 16
"""Messages ZMQ holds per socket before it stops reading (its receive high-water mark):
frames of up to `max_frame` each, so it bounds memory; past it the publisher drops."""
_HELD_FRAMES = 4
"""Live frames held during a replay are bounded in bytes to this many of the largest."""
SLICE = SliceBound(blocks=1024, tokens=16_384)
"""The most an index is given at once: about 2 ms of keying and bookkeeping here."""
_DECODE_EVENTS = 1024
"""Events decoded at once (a few milliseconds); the loop runs between two chunks."""
_FRAME_COST, _BYTES_PER_BLOCK = 50, 128
"""Costs in blocks (about 2 µs each): receiving and sequencing a frame; decoding this many
bytes of it (one object per byte at worst)."""
_REPLAYS = 6
"""Replays per engine a minute (and at once): a healthy stream gaps a few times an hour."""


@dataclass
class SubscriberCounts:
    """What one subscriber met that its sink is not told: for metrics and tests."""

    undecodable: int = 0
    """Frames (live or replayed) that were not a KV-event batch."""
    other_rank: int = 0
    """Batches of a data-parallel rank other than 0, ignored."""
    replays: int = 0
    """Replays asked for."""
    replays_refused: int = 0
    """Gaps not replayed, the engine's replay budget spent: cleared instead."""
    held_dropped: int = 0
    """Live batches dropped because too many, or too many bytes, arrived during one replay."""
    sliced: int = 0
    """Batches passed on in more than one slice."""
    throttled: int = 0
    """Times the engine's budget was spent and its stream read later."""
    throttled_seconds: float = 0.0
    """How much later, in all."""
    logs_left_out: int = 0
    """Log lines about this engine left out by the rate limit."""


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
        max_frame: int = KvEventsSettings.max_frame,
        budget: int = KvEventsSettings.budget,
        check_interval: float = KvEventsSettings.check_interval,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
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
        self._limits = {zmq.MAXMSGSIZE: max_frame, zmq.RCVHWM: _QUEUED, zmq.LINGER: 0}
        self._sleep = sleep
        self._clock = clock
        self._check_interval = check_interval
        self._check_at: float | None = None
        """When the next liveness check is due; None while not connected."""
        self._answering = True
        """Whether the last liveness check was answered: its failures are logged on change."""
        self._budget = Budget(budget, budget, clock)
        self._replays = Budget(_REPLAYS / 60.0, _REPLAYS, clock)
        self._logs = LogLimit(_log, _LOG_EVERY, clock)
        self._connected = False
        self._redial = Redial(reconnect_ivl, reconnect_ivl_max, clock)
        self._dial_after: float | None = None
        """Seconds to wait before dialling again after a lost session; None: no need."""
        self._last: int | None = None
        """The seq of the last batch passed on (or skipped by rank); None: a fresh start."""
        self._live: int | None = None
        """The seq of the last live frame read, applied or not: restarts show against it."""
        self._held: deque[list[bytes]] = deque()
        self._held_bytes = 0
        self._held_limit = held_limit
        self._held_max_bytes = _HELD_FRAMES * max_frame

    async def run(self) -> None:
        """Subscribe and feed the sink until cancelled; sockets are closed with linger 0."""
        sub = self._context.socket(zmq.SUB)
        monitor: zmq.asyncio.Socket | None = None
        try:
            for option, value in (self._options | self._limits).items():
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
            await self._within_budget()
            if self._dial_after is not None:
                wait, self._dial_after = self._dial_after, None
                await self._dial_again(wait, sub, monitor)
            if self._held:
                frames = self._held.popleft()
                self._held_bytes -= _size(frames)
                await self._on_live(frames, sub, monitor)
                await asyncio.sleep(0)  # held frames skip the poller, which would yield
                continue
            check_at = self._check_at
            due = None if check_at is None else max(0, round((check_at - self._clock()) * 1000))
            ready = dict(await poller.poll(due))
            if monitor in ready:
                self._on_monitor(await monitor.recv_multipart())
            if sub in ready:
                await self._on_live(await sub.recv_multipart(), sub, monitor)
            elif not ready and self._check_at is not None:
                await self._check(sub, monitor)

    # ---------------------------------------------------------------- what it may cost

    async def _within_budget(self) -> None:
        """Wait until the engine's budget is repaid; meanwhile its frames queue, then drop."""
        overdue = self._budget.overdue()
        if overdue <= 0:
            return
        self.counts.throttled += 1
        self.counts.throttled_seconds += overdue
        self._note(
            "budget",
            logging.WARNING,
            "over its budget of %d blocks a second, read %.1fs later "
            "(what its publisher cannot queue meanwhile is dropped: a gap)",
            round(self._budget.rate),
            overdue,
        )
        await self._sleep(overdue)

    def _charge(self, frames: list[bytes]) -> None:
        self._budget.charge(_FRAME_COST + _size(frames) // _BYTES_PER_BLOCK)

    def _note(self, kind: str, level: int, message: str, *args: object) -> None:
        self._logs.log(kind, level, "KV events from %s: " + message, self.target.endpoint, *args)
        self.counts.logs_left_out = self._logs.left_out

    # ---------------------------------------------------------------- connection

    def _on_monitor(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        up = bool(event & _UP_EVENTS)
        if up == self._connected:
            return
        self._connected = up
        self._check_at = self._clock() if up else None
        if up:
            self._redial.up()
            self._note("connected", logging.INFO, "connected, confirming the stream")
        else:
            self._note("disconnected", logging.WARNING, "disconnected")
            if event & zmq.EVENT_DISCONNECTED:  # ZMQ never redials after a protocol error
                self._dial_after = self._redial.lost()  # (a frame over `max_frame`): we do
        self._sink.connected(up)

    async def _dial_again(
        self, wait: float, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket
    ) -> None:
        """After `wait`, dial again unless ZMQ's own reconnect has brought the session back."""
        await self._sleep(wait)
        while await monitor.poll(0):
            self._on_monitor(await monitor.recv_multipart())
        if not self._connected and self._dial_after is None:
            with contextlib.suppress(zmq.ZMQError):  # already gone
                sub.disconnect(self.target.endpoint)
            sub.connect(self.target.endpoint)

    # ---------------------------------------------------------------- the sequence

    async def _on_live(
        self, frames: list[bytes], sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket
    ) -> None:
        self._charge(frames)
        try:
            if len(frames) != 3:
                raise KvEventDecodeError(f"a live message has 3 frames, not {len(frames)}")
            seq = frame_seq(frames[1])
        except KvEventDecodeError as exc:
            self._undecodable(exc)
            return
        if self._live is not None and seq <= self._live:
            self._note(
                "restart",
                logging.WARNING,
                "sequence went back from %d to %d, the engine restarted",
                self._live,
                seq,
            )
            self._sink.clear(ClearReason.RESTART)
            self._last = None
        self._live = seq
        batch = await self._decode(frames[2])
        if batch is not None:  # else a missed batch: the next one shows the gap
            await self._sequence(seq, batch, sub, monitor)

    async def _decode(self, payload: bytes) -> EventBatch | None:
        """The batch in `payload`, decoded a chunk of events at a time, the loop running in
        between; None, counted, when it is not one, whatever the decoder raised."""
        try:
            raw = split_batch(payload)
            events: list[KvEvent] = []
            for start in range(0, len(raw.events), _DECODE_EVENTS):
                if start:
                    await asyncio.sleep(0)
                events += decode_events(raw.events[start : start + _DECODE_EVENTS])
        except Exception as exc:  # an engine's bytes must never end the subscriber
            self._undecodable(exc)
            return None
        return EventBatch(raw.ts, events, raw.data_parallel_rank)

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
            await self._deliver(seq, batch)
            return
        self._note("gap", logging.INFO, "batches %d..%d missed, replaying", expected, seq - 1)
        self._sink.gap(expected, seq)
        try:
            await self._replay(expected, seq, sub, monitor)
        except _ReplayFailed as failure:
            self._replay_failed(expected, str(failure))
        else:
            self._note("replay filled", logging.INFO, "replay filled the gap")
            self._sink.replayed(True)
        if self._last is None or seq > self._last:
            await self._deliver(seq, batch)

    def _replay_failed(self, expected: int, why: str) -> None:
        self._note(
            "replay failed",
            logging.WARNING,
            "replay from %d failed (%s); index cleared, rebuilding",
            expected,
            why,
        )
        self._sink.replayed(False)
        self._sink.clear(ClearReason.GAP)
        self._last = None

    async def _deliver(self, seq: int, batch: EventBatch) -> None:
        """Pass `batch` on in slices of bounded work (one, mostly), the loop running between."""
        self._last = seq
        if self._check_at is not None:
            self._check_at = self._clock() + self._check_interval
        if batch.data_parallel_rank not in (None, _RANK):
            self.counts.other_rank += 1
            return
        parts = 0
        for part in slices(batch, SLICE):
            if parts:
                await asyncio.sleep(0)
            parts += 1
            self._budget.charge(sum(map(event_blocks, part.events)))
            self._sink.batch(seq, part)
        self.counts.sliced += parts > 1

    # ---------------------------------------------------------------- replay

    async def _replay(
        self, start: int, live: int, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket
    ) -> None:
        """Pass on batches `start`..`live - 1` (and any after) from the replay socket, or raise
        `_ReplayFailed`; live frames that arrive meanwhile are held for later."""
        if not self._replays.take(1):
            self.counts.replays_refused += 1
            raise _ReplayFailed(f"its budget of {_REPLAYS} replays a minute is spent")
        self.counts.replays += 1
        with self._dealer() as dealer:
            try:
                async with asyncio.timeout(self.target.replay_timeout):
                    await dealer.send_multipart(replay_request(start))
                    await self._read_replay(_Replies(dealer, sub, monitor))
            except TimeoutError:
                raise _ReplayFailed(f"no answer within {self.target.replay_timeout:g}s") from None
        if self._last is None or self._last < live - 1:
            raise _ReplayFailed(f"it ended at {self._last}, before {live - 1}")

    @contextlib.contextmanager
    def _dealer(self) -> Iterator[zmq.asyncio.Socket]:
        """A DEALER on the replay socket, never reused: a late answer must not confuse the
        next replay or check."""
        dealer = self._context.socket(zmq.DEALER)
        try:
            for option, value in self._limits.items():
                dealer.setsockopt(option, value)
            dealer.connect(self.target.replay_endpoint)
            yield dealer
        finally:
            dealer.close(linger=0)

    async def _read_replay(self, replies: _Replies) -> None:
        while True:
            seq, payload = await self._next_reply(replies)
            if seq == END_SEQ:
                return
            expected = 0 if self._last is None else self._last + 1
            if seq > expected:  # the engine no longer holds what was missed
                raise _ReplayFailed(f"batch {expected} is not in it (it went on with {seq})")
            if seq == expected:
                await self._deliver(seq, await self._replayed_batch(payload))
            await self._within_budget()

    # ---------------------------------------------------------------- the liveness check

    async def _check(self, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
        """Ask the replay socket for every batch from the last one applied on (see above)."""
        self._check_at = self._clock() + self._check_interval
        try:
            with self._dealer() as dealer:
                async with asyncio.timeout(self.target.replay_timeout):
                    await dealer.send_multipart(replay_request(self._last or 0))
                    await self._read_check(_Replies(dealer, sub, monitor))
        except TimeoutError:
            timeout = self.target.replay_timeout
            self._unconfirmed(f"no answer to the liveness check within {timeout:g}s")
        except _ReplayFailed as failure:
            self._unconfirmed(f"the liveness check got {failure}")

    async def _read_check(self, replies: _Replies) -> None:
        asked = self._last
        seq, payload = await self._next_reply(replies)
        if seq == END_SEQ and asked is not None:
            self._restarted_quietly(asked)
            return
        gap: int | None = None
        """Where the missed batches the answer holds begin; None: none (yet)."""
        failed = False
        try:
            while seq != END_SEQ:
                expected = 0 if self._last is None else self._last + 1
                if seq >= expected:  # the one asked for was applied: it is not decoded again
                    batch = await self._replayed_batch(payload)
                    if gap is None and not failed:
                        gap = expected
                        self._note("gap", logging.INFO, "batches from %d missed, replaying", gap)
                        self._sink.gap(gap, seq + 1)
                    if seq > expected and gap is not None:
                        self._replay_failed(
                            gap, f"batch {expected} is not in it (it went on with {seq})"
                        )
                        gap, failed = None, True
                    await self._deliver(seq, batch)
                    await self._within_budget()
                seq, payload = await self._next_reply(replies)
        except BaseException:  # the timeout, an undecodable reply, or the end of the task
            if gap is not None:
                self._replay_failed(gap, "the liveness check ended short")
            raise
        if gap is not None:
            self._note("replay filled", logging.INFO, "replay filled the gap")
            self._sink.replayed(True)
        if not self._answering:
            self._answering = True
            self._note("answering", logging.INFO, "its replay socket answers again")
        self._sink.confirmed(self._last)

    def _restarted_quietly(self, asked: int) -> None:
        """The publisher no longer holds batch `asked`, nor any after: its sequence went back."""
        self._note(
            "restart",
            logging.WARNING,
            "the publisher holds no batch from %d on, the engine restarted",
            asked,
        )
        self._sink.clear(ClearReason.RESTART)
        self._last = self._live = None
        self._check_at = self._clock()

    def _unconfirmed(self, why: str) -> None:
        if self._answering:
            self._answering = False
            self._note("unanswered", logging.WARNING, "%s: the stream cannot be confirmed", why)
        self._sink.unconfirmed(why)

    async def _next_reply(self, replies: _Replies) -> tuple[int, bytes]:
        """The next reply's seq (`END_SEQ` at the end marker) and payload, undecoded."""
        while True:
            ready = dict(await replies.poller.poll())
            if replies.monitor in ready:
                self._on_monitor(await replies.monitor.recv_multipart())
            if replies.sub in ready:
                frames = await replies.sub.recv_multipart()
                self._charge(frames)  # and again when it is read, if it is kept
                self._hold(frames)
            if replies.dealer in ready:
                break
        frames = await replies.dealer.recv_multipart()
        self._charge(frames)
        try:
            return parse_replay_reply(frames)
        except KvEventDecodeError as exc:
            self._undecodable(exc)
            raise _ReplayFailed("an undecodable reply") from None

    async def _replayed_batch(self, payload: bytes) -> EventBatch:
        batch = await self._decode(payload)
        if batch is None:
            raise _ReplayFailed("an undecodable reply")
        return batch

    def _hold(self, frames: list[bytes]) -> None:
        """Keep a live frame for after the replay; past the bounds the oldest go (a gap the
        next replay may fill)."""
        self._held.append(frames)
        self._held_bytes += _size(frames)
        while len(self._held) > self._held_limit or self._held_bytes > self._held_max_bytes:
            self._held_bytes -= _size(self._held.popleft())
            self.counts.held_dropped += 1

    def _undecodable(self, exc: Exception) -> None:
        self.counts.undecodable += 1
        self._note(
            "undecodable",
            logging.WARNING,
            "undecodable frame (%d so far): %s: %s",
            self.counts.undecodable,
            type(exc).__name__,
            exc,
        )


class _Replies:
    """The sockets one replay or check reads: its DEALER, and meanwhile the live frames
    (held for later) and the monitor."""

    __slots__ = ("dealer", "monitor", "poller", "sub")

    def __init__(
        self, dealer: zmq.asyncio.Socket, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket
    ) -> None:
        self.dealer, self.sub, self.monitor = dealer, sub, monitor
        self.poller = zmq.asyncio.Poller()
        for socket in (dealer, sub, monitor):
            self.poller.register(socket, zmq.POLLIN)


def _size(frames: list[bytes]) -> int:
    return sum(map(len, frames))
