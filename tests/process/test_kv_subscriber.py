"""Proves an engine's KV-event subscriber passes on every batch in order, or says what it lost.

The subscriber reads the simulated engine's real publisher (vLLM's PUB and
replay sockets, with its faults) on loopback, and a hand-made XPUB for frames
no publisher sends; a recording sink shows what the index would be told.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace

import msgspec
import pytest
import zmq
import zmq.asyncio

from headcount.kvevents import (
    BlockStored,
    EventBatch,
    Layout,
    encode_batch,
    pub_frames,
    replay_end,
    replay_reply,
)
from headcount.kvindex.stream import ClearReason, SubscriberTarget
from headcount.kvindex.subscriber import SLICE, EventSubscriber
from headcount.sim.engine.kv_events_config import KvEventsConfig
from headcount.sim.engine.kv_publisher import KvEventPublisher
from headcount.sim.loopback import free_port
from tests.support import wait_until

TOPIC = "kv-events"
REPLAY_TIMEOUT = 0.5
TIMEOUT = 5.0
LAYOUTS: list[Layout] = ["0.10", "current"]


@dataclass
class RecordingSink:
    """A `StreamSink` that keeps every call, in order."""

    calls: list[tuple[object, ...]] = field(default_factory=list)
    batches: list[tuple[int, EventBatch]] = field(default_factory=list)
    connections: list[bool] = field(default_factory=list)
    """Every `connected` call, never forgotten."""

    def connected(self, up: bool) -> None:
        self.calls.append(("connected", up))
        self.connections.append(up)

    def batch(self, seq: int, batch: EventBatch) -> None:
        self.calls.append(("batch", seq))
        self.batches.append((seq, batch))

    def gap(self, expected: int, got: int) -> None:
        self.calls.append(("gap", expected, got))

    def replayed(self, filled: bool) -> None:
        self.calls.append(("replayed", filled))

    def clear(self, reason: ClearReason) -> None:
        self.calls.append(("clear", reason))

    def confirmed(self, latest: int | None) -> None:
        self.calls.append(("confirmed", latest))

    def unconfirmed(self, why: str) -> None:
        self.calls.append(("unconfirmed", why))

    def seqs(self) -> list[int]:
        return [seq for seq, _ in self.batches]

    def markers(self) -> list[int]:
        """The first block hash of each batch's first event: which step it was."""
        return [_marker(batch) for _, batch in self.batches]

    def control(self) -> list[tuple[object, ...]]:
        """Every call but the batches and the liveness check's."""
        return [call for call in self.calls if call[0] not in _NOT_CONTROL]

    def stream(self) -> list[tuple[object, ...]]:
        """Every call but the liveness check's."""
        return [call for call in self.calls if call[0] not in _NOT_CONTROL[1:]]

    def checks(self) -> list[tuple[object, ...]]:
        """The liveness check's calls."""
        return [call for call in self.calls if call[0] in ("confirmed", "unconfirmed")]

    def forget(self) -> None:
        self.calls.clear()
        self.batches.clear()


_NOT_CONTROL = ("batch", "confirmed", "unconfirmed")


def _marker(batch: EventBatch) -> int:
    event = batch.events[0]
    assert isinstance(event, BlockStored)
    marker = event.block_hashes[0]
    assert isinstance(marker, int)
    return marker


class Steps:
    """Scheduler steps fed to a publisher, each storing one block marked by a number."""

    def __init__(self, publisher: KvEventPublisher) -> None:
        self.publisher = publisher
        self.next_marker = 1000

    def publish(self, count: int) -> list[int]:
        markers = list(range(self.next_marker, self.next_marker + count))
        self.next_marker += count
        for marker in markers:
            self.publisher.stored([marker], None, [marker] * 16, 16, None)
            self.publisher.end_step()
        return markers

    async def join(self, sink: RecordingSink) -> list[tuple[object, ...]]:
        """Publish until the subscriber passes batches on (a PUB sends nothing to a subscriber
        it has not seen yet), then forget what the sink saw; what it was."""

        def arrived() -> bool:
            self.publish(1)
            return bool(sink.batches) and not _replaying(sink)

        await wait_until(arrived, what="the subscriber joined")
        await wait_until(lambda: self.publisher.status()["queued"] == 0)
        last = self.publisher.status()["next_seq"]
        assert isinstance(last, int)
        await wait_until(lambda: sink.seqs()[-1:] == [last - 1], what="the joining batches")
        calls = list(sink.calls)
        sink.forget()
        return calls


async def first_check(sink: RecordingSink) -> None:
    """Wait for the end of the liveness check the subscriber makes on connecting."""
    await wait_until(lambda: bool(sink.checks()), what="the first liveness check")


def _replaying(sink: RecordingSink) -> bool:
    gaps = sum(call[0] == "gap" for call in sink.calls)
    return gaps > sum(call[0] == "replayed" for call in sink.calls)


def _publisher(
    layout: Layout = "current", port: int = 0, replay_port: int = 0, buffer_steps: int = 100
) -> KvEventPublisher:
    config = KvEventsConfig(
        port=port, replay_port=replay_port, layout=layout, topic=TOPIC, buffer_steps=buffer_steps
    )
    publisher = KvEventPublisher(config, "127.0.0.1", reset_cache=lambda: None)
    publisher.start()
    return publisher


@contextlib.asynccontextmanager
async def publishing(layout: Layout = "current", **kwargs: int) -> AsyncIterator[Steps]:
    publisher = _publisher(layout, **kwargs)
    try:
        yield Steps(publisher)
    finally:
        await publisher.close()


def target_of(publisher: KvEventPublisher) -> SubscriberTarget:
    assert publisher.replay_endpoint is not None
    return SubscriberTarget(publisher.endpoint, publisher.replay_endpoint, TOPIC, REPLAY_TIMEOUT)


@contextlib.asynccontextmanager
async def subscribing(
    target: SubscriberTarget, *, held_limit: int = 10_000, check_interval: float = 30.0
) -> AsyncIterator[tuple[EventSubscriber, RecordingSink]]:
    """A running subscriber; on exit it must still be running, and end cancelled."""
    sink = RecordingSink()
    subscriber = EventSubscriber(
        target,
        sink,
        reconnect_ivl=0.05,
        reconnect_ivl_max=0.2,
        held_limit=held_limit,
        check_interval=check_interval,
    )
    task = asyncio.create_task(subscriber.run())
    try:
        yield subscriber, sink
    finally:
        assert not task.done(), task.exception()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()


@contextlib.asynccontextmanager
async def joined(
    layout: Layout = "current", *, check_interval: float = 30.0, **kwargs: int
) -> AsyncIterator[tuple[Steps, EventSubscriber, RecordingSink]]:
    async with publishing(layout, **kwargs) as steps:
        target = target_of(steps.publisher)
        async with subscribing(target, check_interval=check_interval) as (subscriber, sink):
            await steps.join(sink)
            yield steps, subscriber, sink


async def received(sink: RecordingSink, markers: list[int]) -> None:
    await wait_until(lambda: sink.markers()[-1:] == markers[-1:], what=f"batch {markers[-1]}")


def assert_in_sequence(sink: RecordingSink) -> None:
    seqs = sink.seqs()
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


# ---------------------------------------------------------------- in order


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_batches_are_passed_on_in_order_in_both_layouts(layout: Layout) -> None:
    async with joined(layout) as (steps, subscriber, sink):
        replays = subscriber.counts.replays
        markers = steps.publish(50)
        await received(sink, markers)
        assert sink.markers() == markers
        assert_in_sequence(sink)
        assert sink.control() == []
        assert subscriber.counts.replays == replays


async def test_reaching_the_publisher_is_reported_once_before_any_batch() -> None:
    async with publishing() as steps:
        async with subscribing(target_of(steps.publisher)) as (_, sink):
            joining = await steps.join(sink)
            assert joining[0] == ("connected", True)
            assert [call for call in joining if call[0] == "connected"] == [("connected", True)]


# ---------------------------------------------------------------- gaps


async def test_a_dropped_run_is_filled_by_replay() -> None:
    async with joined() as (steps, subscriber, sink):
        replays = subscriber.counts.replays
        base = steps.publisher.status()["next_seq"]
        assert isinstance(base, int)
        steps.publisher.faults.drop = 3
        markers = steps.publish(6)
        await received(sink, markers)
        assert sink.markers() == markers
        assert_in_sequence(sink)
        assert sink.control() == [("gap", base, base + 3), ("replayed", True)]
        assert subscriber.counts.replays == replays + 1


async def test_a_silent_publisher_that_resumes_is_caught_up_by_replay() -> None:
    async with joined() as (steps, _, sink):
        steps.publisher.faults.silent = True
        missed = steps.publish(4)
        await wait_until(lambda: steps.publisher.status()["withheld"] == 4)
        steps.publisher.faults.silent = False
        markers = missed + steps.publish(2)
        await received(sink, markers)
        assert sink.markers() == markers
        assert [call[0] for call in sink.control()] == ["gap", "replayed"]
        assert sink.control()[1] == ("replayed", True)


async def test_a_gap_the_replay_buffer_no_longer_holds_clears_the_index() -> None:
    async with joined() as (steps, _, sink):
        base = steps.publisher.status()["next_seq"]
        assert isinstance(base, int)
        steps.publisher.resize_replay_buffer(2)
        steps.publisher.faults.drop = 5
        markers = steps.publish(6)
        await received(sink, markers)
        assert sink.control() == [
            ("gap", base, base + 5),
            ("replayed", False),
            ("clear", ClearReason.GAP),
        ]
        assert sink.markers() == markers[-1:]
        more = steps.publish(3)
        await received(sink, more)
        assert sink.markers() == markers[-1:] + more
        assert_in_sequence(sink)


async def test_an_unanswered_replay_clears_the_index_and_the_next_replay_works() -> None:
    async with joined() as (steps, subscriber, sink):
        replays = subscriber.counts.replays
        steps.publisher.faults.replay = False
        steps.publisher.faults.drop = 2
        markers = steps.publish(3)
        await received(sink, markers)
        assert [call[1:] for call in sink.control()[1:]] == [(False,), (ClearReason.GAP,)]
        assert sink.markers() == markers[-1:]
        steps.publisher.faults.replay = True
        steps.publisher.faults.drop = 2
        sink.forget()
        markers = steps.publish(3)
        await received(sink, markers)
        assert sink.markers() == markers
        assert sink.control()[1:] == [("replayed", True)]
        assert subscriber.counts.replays == replays + 2


async def test_a_late_joiner_is_replayed_from_zero_at_once_by_the_liveness_check() -> None:
    async with publishing() as steps:
        before = steps.publish(5)
        await wait_until(lambda: steps.publisher.status()["next_seq"] == 5)
        async with subscribing(target_of(steps.publisher)) as (_, sink):
            await first_check(sink)
            assert sink.control() == [("connected", True), ("gap", 0, 1), ("replayed", True)]
            assert sink.checks() == [("confirmed", 4)]
            assert sink.seqs() == [0, 1, 2, 3, 4]
            assert sink.markers() == before


# ---------------------------------------------------------------- the liveness check

CHECK = 0.1
"""Seconds of silence before a liveness check, in these tests."""


def last_seq(steps: Steps) -> int:
    next_seq = steps.publisher.status()["next_seq"]
    assert isinstance(next_seq, int)
    return next_seq - 1


async def test_a_quiet_stream_is_confirmed_again_and_again_without_a_gap() -> None:
    async with joined(check_interval=CHECK) as (steps, subscriber, sink):
        await wait_until(lambda: len(sink.checks()) >= 3, what="three liveness checks")
        assert set(sink.checks()) == {("confirmed", last_seq(steps))}
        assert sink.control() == [] and sink.batches == []
        assert subscriber.counts.replays == 0


async def test_batches_withheld_then_quiet_are_replayed_by_the_liveness_check() -> None:
    async with joined(check_interval=CHECK) as (steps, _, sink):
        base = last_seq(steps) + 1
        steps.publisher.faults.silent = True
        markers = steps.publish(3)
        await received(sink, markers)
        assert sink.markers() == markers
        assert sink.control() == [("gap", base, base + 1), ("replayed", True)]
        await wait_until(lambda: ("confirmed", base + 2) in sink.checks(), what="confirmed")


async def test_a_liveness_check_past_the_replay_buffer_clears_the_index() -> None:
    async with joined(check_interval=CHECK) as (steps, _, sink):
        base = last_seq(steps) + 1
        steps.publisher.faults.silent = True
        steps.publisher.resize_replay_buffer(2)
        markers = steps.publish(5)
        await received(sink, markers)
        assert sink.control() == [
            ("gap", base, base + 4),
            ("replayed", False),
            ("clear", ClearReason.GAP),
        ]
        assert sink.markers() == markers[-2:]


async def test_a_quiet_restart_is_found_by_the_liveness_check() -> None:
    async with joined(check_interval=CHECK) as (steps, _, sink):
        steps.publisher.restart()
        await wait_until(lambda: ("confirmed", None) in sink.checks(), what="checked from 0")
        assert sink.control() == [("clear", ClearReason.RESTART)]
        markers = steps.publish(2)
        await received(sink, markers)
        assert sink.seqs() == [0, 1] and sink.control() == [("clear", ClearReason.RESTART)]


async def test_an_unanswered_liveness_check_is_told_each_time_and_logged_once_per_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="headcount.kvindex.subscriber")
    async with joined(check_interval=CHECK) as (steps, _, sink):
        steps.publisher.faults.replay = False
        await wait_until(lambda: len(sink.checks()) >= 3, what="three unanswered checks")
        assert {call[0] for call in sink.checks()} == {"unconfirmed"}
        assert sink.checks()[0] == ("unconfirmed", "no answer to the liveness check within 0.5s")
        steps.publisher.faults.replay = True
        await wait_until(lambda: sink.checks()[-1][0] == "confirmed", what="answered again")
    messages = [record.getMessage() for record in caplog.records]
    assert sum("the stream cannot be confirmed" in m for m in messages) == 1
    assert sum("answers again" in m for m in messages) == 1


# ---------------------------------------------------------------- restarts


async def test_a_sequence_that_goes_back_clears_the_index_as_a_restart() -> None:
    async with joined() as (steps, _, sink):
        steps.publish(3)
        await wait_until(lambda: len(sink.batches) == 3)
        steps.publisher.restart()
        sink.forget()
        markers = steps.publish(2)
        await received(sink, markers)
        assert sink.control() == [("clear", ClearReason.RESTART)]
        assert sink.seqs() == [0, 1]
        assert sink.markers() == markers


# ---------------------------------------------------------------- reaching the publisher


async def test_a_port_that_is_no_publisher_is_never_reported_connected() -> None:
    accepted = 0

    async def accept_and_close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(accept_and_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = SubscriberTarget(
        f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{free_port()}", TOPIC, REPLAY_TIMEOUT
    )
    try:
        async with subscribing(target) as (_, sink):
            await wait_until(lambda: accepted >= 3, what="the subscriber retried")
            assert sink.calls == []
    finally:
        server.close()
        await server.wait_closed()


async def tried(port: int) -> None:
    """Wait until a subscriber's socket reaches `port`: a plain listener there accepts its
    connection and reads the start of its ZMTP greeting, then goes, answering nothing."""
    loop = asyncio.get_running_loop()
    with socket.socket() as stand_in:
        stand_in.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        stand_in.bind(("127.0.0.1", port))
        stand_in.listen(1)
        stand_in.setblocking(False)
        attempt, _ = await asyncio.wait_for(loop.sock_accept(stand_in), TIMEOUT)
        with attempt:
            greeting = await asyncio.wait_for(loop.sock_recv(attempt, 10), TIMEOUT)
    assert greeting[:1] == b"\xff", greeting  # the ZMTP signature's first byte


async def test_a_publisher_that_appears_later_is_reached_and_read() -> None:
    port, replay_port = free_port(), free_port()
    target = SubscriberTarget(
        f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}", TOPIC, REPLAY_TIMEOUT
    )
    async with subscribing(target) as (_, sink):
        await tried(port)
        assert sink.calls == []
        async with publishing(port=port, replay_port=replay_port) as steps:
            await wait_until(lambda: ("connected", True) in sink.calls, what="connected")
            # The monitor reports in order: what the attempt above made is heard before this.
            assert sink.calls[0] == ("connected", True), sink.calls
            await steps.join(sink)
            markers = steps.publish(4)
            await received(sink, markers)
            assert sink.markers() == markers
        await wait_until(lambda: sink.connections == [True, False], what="disconnected")
        another = _publisher(port=port, replay_port=replay_port)
        try:
            await wait_until(lambda: sink.connections == [True, False, True], what="reconnected")
        finally:
            await another.close()


# ---------------------------------------------------------------- frames no publisher sends


class HandPub:
    """An XPUB that sends exactly the frames a test gives, once the subscriber has subscribed."""

    def __init__(self) -> None:
        self.socket = zmq.asyncio.Context.instance().socket(zmq.XPUB)
        self.socket.bind("tcp://127.0.0.1:0")
        self.endpoint: str = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    async def subscribed(self) -> None:
        assert await self.socket.poll(5000), "no subscription arrived"
        assert await self.socket.recv() == b"\x01" + TOPIC.encode()

    async def send(self, seq: int, payload: bytes) -> None:
        await self.socket.send_multipart(pub_frames(TOPIC.encode(), seq, payload))


@contextlib.contextmanager
def hand_pub() -> Iterator[HandPub]:
    pub = HandPub()
    try:
        yield pub
    finally:
        pub.socket.close(linger=0)


def payload(marker: int, rank: int | None = 0) -> bytes:
    batch = EventBatch(1.0, [BlockStored([marker], None, [marker] * 16, 16)], rank)
    return encode_batch(batch, "current")


def hand_target(pub: HandPub) -> SubscriberTarget:
    """No replay socket: every replay goes unanswered."""
    return SubscriberTarget(pub.endpoint, f"tcp://127.0.0.1:{free_port()}", TOPIC, REPLAY_TIMEOUT)


async def test_an_undecodable_batch_is_counted_and_missed_and_the_task_survives() -> None:
    with hand_pub() as pub:
        async with subscribing(hand_target(pub)) as (subscriber, sink):
            await pub.subscribed()
            await first_check(sink)
            await pub.send(0, payload(10))
            await pub.send(1, b"\xc1 not msgpack")
            await pub.socket.send_multipart([TOPIC.encode(), b"short"])
            await pub.send(2, payload(12))
            await received(sink, [12])
            assert sink.stream() == [
                ("connected", True),
                ("batch", 0),
                ("gap", 1, 2),
                ("replayed", False),
                ("clear", ClearReason.GAP),
                ("batch", 2),
            ]
            assert subscriber.counts.undecodable == 2
            await pub.send(3, payload(13))
            await received(sink, [13])


async def test_batches_of_another_data_parallel_rank_are_ignored_without_a_gap() -> None:
    with hand_pub() as pub:
        async with subscribing(hand_target(pub)) as (subscriber, sink):
            await pub.subscribed()
            await first_check(sink)
            await pub.send(0, payload(10, rank=None))
            await pub.send(1, payload(11, rank=1))
            await pub.send(2, payload(12, rank=0))
            await received(sink, [12])
            assert sink.markers() == [10, 12]
            assert sink.control() == [("connected", True)]
            assert subscriber.counts.other_rank == 1


# ---------------------------------------------------------------- replies no publisher sends


class HandRouter:
    """A replay socket that answers only as a test says."""

    def __init__(self) -> None:
        self.socket = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        self.socket.bind("tcp://127.0.0.1:0")
        self.endpoint: str = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    async def request(self) -> tuple[bytes, int]:
        """The next replay request: who asked, from which seq."""
        assert await self.socket.poll(5000), "no replay request arrived"
        identity, delimiter, start = await self.socket.recv_multipart()
        assert delimiter == b""
        return identity, int.from_bytes(start, "big")

    async def answer(self, identity: bytes, markers: dict[int, int]) -> None:
        """Batches `seq: marker`, then the end marker."""
        for seq, marker in markers.items():
            reply = replay_reply("current", TOPIC.encode(), seq, payload(marker))
            await self.socket.send_multipart([identity, *reply])
        await self.socket.send_multipart([identity, *replay_end("current")])


async def first_check_answered(router: HandRouter, sink: RecordingSink) -> None:
    """Answer the liveness check the subscriber makes on connecting: nothing published."""
    identity, start = await router.request()
    assert start == 0
    await router.answer(identity, {})
    await first_check(sink)
    assert sink.checks() == [("confirmed", None)]


@contextlib.asynccontextmanager
async def hand_made() -> AsyncIterator[tuple[HandPub, HandRouter, SubscriberTarget]]:
    router = HandRouter()
    try:
        with hand_pub() as pub:
            yield pub, router, SubscriberTarget(pub.endpoint, router.endpoint, TOPIC, 0.5)
    finally:
        router.socket.close(linger=0)


async def test_a_replay_that_ends_before_the_live_batch_clears_the_index() -> None:
    async with hand_made() as (pub, router, target), subscribing(target) as (_, sink):
        await pub.subscribed()
        await first_check_answered(router, sink)
        await pub.send(0, payload(10))
        await pub.send(3, payload(13))
        identity, start = await router.request()
        assert start == 1
        await router.answer(identity, {1: 11})
        await received(sink, [13])
        assert sink.stream()[1:] == [
            ("batch", 0),
            ("gap", 1, 3),
            ("batch", 1),
            ("replayed", False),
            ("clear", ClearReason.GAP),
            ("batch", 3),
        ]


async def test_a_late_answer_to_an_abandoned_replay_is_not_taken_for_the_next() -> None:
    async with hand_made() as (pub, router, target), subscribing(target) as (_, sink):
        await pub.subscribed()
        await first_check_answered(router, sink)
        await pub.send(0, payload(10))
        await pub.send(2, payload(12))
        abandoned, _ = await router.request()
        await wait_until(lambda: ("replayed", False) in sink.calls, what="the replay timed out")
        await pub.send(5, payload(15))
        current, start = await router.request()
        assert start == 3
        await router.answer(abandoned, {3: 13, 4: 14})
        await wait_until(lambda: sink.calls.count(("replayed", False)) == 2, what="2nd timeout")
        assert current != abandoned
        assert sink.markers() == [10, 12, 15]


async def test_the_socket_of_an_abandoned_replay_is_closed() -> None:
    async with hand_made() as (pub, router, target), subscribing(target) as (_, sink):
        router.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        await pub.subscribed()
        await first_check_answered(router, sink)
        await pub.send(0, payload(10))
        await pub.send(2, payload(12))
        abandoned, _ = await router.request()
        await wait_until(lambda: ("replayed", False) in sink.calls, what="the replay timed out")

        async def gone() -> bool:
            try:
                await router.socket.send_multipart([abandoned, *replay_end("current")])
            except zmq.ZMQError as exc:
                return exc.errno == zmq.EHOSTUNREACH
            return False

        await wait_until(gone, what="the abandoned DEALER disconnected")


async def test_live_batches_held_during_a_replay_are_bounded_and_the_rest_replayed() -> None:
    async with (
        hand_made() as (pub, router, target),
        subscribing(replace(target, replay_timeout=5.0), held_limit=4) as (subscriber, sink),
    ):
        await pub.subscribed()
        await first_check_answered(router, sink)
        await pub.send(0, payload(10))
        await pub.send(2, payload(12))
        identity, _ = await router.request()
        for seq in range(3, 13):
            await pub.send(seq, payload(10 + seq))
        await wait_until(lambda: subscriber.counts.held_dropped == 6, what="held batches")
        await router.answer(identity, {1: 11, 2: 12, 3: 13})
        identity, start = await router.request()
        assert start == 4
        await router.answer(identity, {seq: 10 + seq for seq in range(4, 13)})
        await received(sink, [22])
        assert sink.markers() == list(range(10, 23))
        assert sink.control()[1:] == [
            ("gap", 1, 2),
            ("replayed", True),
            ("gap", 4, 9),  # the 4 newest held were kept
            ("replayed", True),
        ]


@contextlib.contextmanager
def loop_turns_at_batches(sink: RecordingSink) -> Iterator[list[int]]:
    """Count the event loop's turns; the list holds, per batch the sink is given, the count
    then (two batches in one turn show as a repeated count)."""
    turns = 0

    async def count() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    counting = asyncio.create_task(count())
    seen: list[int] = []
    record = sink.batch
    sink.batch = lambda seq, batch: (seen.append(turns), record(seq, batch))[1]  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        counting.cancel()


async def test_a_burst_of_batches_lets_the_loop_run_between_any_two() -> None:
    with hand_pub() as pub:
        async with subscribing(hand_target(pub)) as (_, sink):
            await pub.subscribed()
            await first_check(sink)
            with loop_turns_at_batches(sink) as seen:
                for seq in range(500):
                    pub.socket.send_multipart(
                        pub_frames(TOPIC.encode(), seq, payload(seq)), zmq.NOBLOCK
                    )
                await received(sink, [499])
            assert len(set(seen)) == len(seen)


# ---------------------------------------------------------------- hostile publishers


def padded(marker: int, size: int) -> bytes:
    """A one-block batch of about `size` bytes, cheap to decode: the bulk is one string."""
    batch = EventBatch(1.0, [BlockStored([marker], None, [marker] * 16, 16, medium="x" * size)], 0)
    return encode_batch(batch, "current")


def dense(first_hash: int, blocks: int) -> bytes:
    """One `BlockStored` of `blocks` one-token blocks: the most work per byte."""
    hashes = list(range(first_hash, first_hash + blocks))
    return encode_batch(EventBatch(1.0, [BlockStored(hashes, None, [1] * blocks, 1)], 0), "current")


async def resubscribed(pub: HandPub) -> None:
    """Wait for the subscriber's next subscription (after it reconnected)."""
    for _ in range(10):
        assert await pub.socket.poll(5000), "no subscription arrived"
        if (await pub.socket.recv()).startswith(b"\x01"):
            return
    raise AssertionError("no new subscription among 10 messages")


async def test_a_frame_larger_than_the_bound_is_never_read_and_shows_as_a_gap() -> None:
    with hand_pub() as pub:
        async with subscribing(hand_target(pub)) as (_, sink):
            await pub.subscribed()
            await first_check(sink)
            await pub.send(0, payload(10))
            await received(sink, [10])
            await pub.send(1, padded(11, 3 * 1024 * 1024))  # over the 2 MiB default

            def read_or_refused() -> bool:
                return 11 in sink.markers() or sink.connections[-2:] == [False, True]

            await wait_until(read_or_refused, what="the large frame read, or refused")
            assert 11 not in sink.markers()
            await resubscribed(pub)
            await pub.send(2, payload(12))
            await received(sink, [12])
            assert sink.markers() == [10, 12]
            assert ("gap", 1, 2) in sink.calls


async def test_a_batch_of_many_blocks_is_passed_on_in_slices_the_loop_running_between() -> None:
    with hand_pub() as pub:
        async with subscribing(hand_target(pub)) as (subscriber, sink):
            await pub.subscribed()
            await first_check(sink)
            with loop_turns_at_batches(sink) as seen:
                await pub.send(0, dense(1, 5000))
                await wait_until(
                    lambda: sum(blocks(b) for _, b in sink.batches) == 5000, what="the slices"
                )
            assert sink.seqs() == [0] * len(sink.batches)
            assert max(blocks(b) for _, b in sink.batches) <= SLICE.blocks
            assert len(set(seen)) == len(seen)  # the loop ran between any two
            assert subscriber.counts.sliced == 1


def blocks(batch: EventBatch) -> int:
    return sum(len(e.block_hashes) for e in batch.events if isinstance(e, BlockStored))


async def test_an_engine_over_its_budget_is_read_later() -> None:
    arrived: list[float] = []
    with hand_pub() as pub:
        async with subscribing(hand_target(pub)) as (subscriber, sink):
            await pub.subscribed()
            await first_check(sink)
            record = sink.batch
            sink.batch = lambda seq, batch: (arrived.append(time.monotonic()), record(seq, batch))[
                1
            ]  # type: ignore[method-assign]
            frames = 30  # 5,000 blocks each: three times the default budget of 50,000 a second
            for seq in range(frames):
                await pub.send(seq, dense(seq * 5000, 5000))
            await wait_until(lambda: sink.seqs()[-1:] == [frames - 1], timeout=15, what="all")
            assert sink.control() == [("connected", True)]
            assert subscriber.counts.throttled >= 1
            assert arrived[-1] - arrived[0] >= 1.5  # 100,000 blocks over the burst at 50,000/s


def nested(marker: int, depth: int) -> bytes:
    """A batch whose block's `extra_keys` entry nests `depth` arrays deep."""
    event = BlockStored([marker], None, [marker] * 16, 16, extra_keys=[("MARK",)])
    encoded = encode_batch(EventBatch(1.0, [event], 0), "current")
    return encoded.replace(msgspec.msgpack.encode(("MARK",)), b"\x91" * depth + b"\xc0")


async def test_a_batch_nested_too_deep_to_decode_is_missed_and_the_task_survives() -> None:
    with hand_pub() as pub:
        async with subscribing(hand_target(pub)) as (subscriber, sink):
            await pub.subscribed()
            await first_check(sink)
            await pub.send(0, payload(10))
            await pub.send(1, nested(11, 5000))
            await pub.send(2, payload(12))
            await received(sink, [12])
            assert sink.markers() == [10, 12]
            assert ("gap", 1, 2) in sink.calls
            assert subscriber.counts.undecodable == 1


async def test_a_sequence_going_back_and_forth_is_logged_once_not_per_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="headcount.kvindex.subscriber")
    with hand_pub() as pub:
        async with subscribing(hand_target(pub)) as (_, sink):
            await pub.subscribed()
            await first_check(sink)
            for seq in [0, 1] * 100:
                await pub.send(seq, payload(10 + seq))
            await wait_until(lambda: len(sink.batches) == 200, what="every batch")
            assert sink.control().count(("clear", ClearReason.RESTART)) == 99
    restarts = [r for r in caplog.records if "sequence went back" in r.getMessage()]
    assert len(restarts) == 1


@contextlib.asynccontextmanager
async def answering_short(router: HandRouter) -> AsyncIterator[list[int]]:
    """Answers every replay request at once with the end marker alone; yields the starts."""
    starts: list[int] = []

    async def answer() -> None:
        while True:
            identity, _, start = await router.socket.recv_multipart()
            starts.append(int.from_bytes(start, "big"))
            await router.socket.send_multipart([identity, *replay_end("current")])

    task = asyncio.create_task(answer())
    try:
        yield starts
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_replays_are_budgeted_and_a_gap_past_the_budget_clears_without_asking() -> None:
    async with (
        hand_made() as (pub, router, target),
        subscribing(target) as (subscriber, sink),
        answering_short(router) as starts,
    ):
        await pub.subscribed()
        await first_check(sink)
        seqs = list(range(0, 40, 2))  # every message skips one
        for seq in seqs:
            await pub.send(seq, payload(10 + seq))
        await received(sink, [10 + seqs[-1]])
        assert sink.seqs() == seqs
        gaps = len(seqs) - 1
        assert sink.control().count(("clear", ClearReason.GAP)) == gaps
        assert starts[0] == 0  # the liveness check on connecting
        assert (subscriber.counts.replays, len(starts[1:])) == (6, 6)
        assert subscriber.counts.replays_refused == gaps - 6


async def test_live_frames_held_during_a_replay_are_bounded_in_bytes() -> None:
    async with (
        hand_made() as (pub, router, target),
        subscribing(replace(target, replay_timeout=5.0)) as (subscriber, sink),
    ):
        await pub.subscribed()
        await first_check_answered(router, sink)
        await pub.send(0, payload(10))
        await pub.send(2, payload(12))
        identity, _ = await router.request()
        for seq in range(3, 15):  # 12 MiB while the default bound is 4 frames of 2 MiB
            await pub.send(seq, padded(10 + seq, 1024 * 1024))
        await wait_until(lambda: subscriber.counts.held_dropped >= 4, what="held frames dropped")
        await router.answer(identity, {1: 11, 2: 12})
        identity, start = await router.request()  # the newest held show what was dropped
        await router.answer(identity, {})
        await received(sink, [24])
        kept = 3 + subscriber.counts.held_dropped
        assert start == 3
        assert sink.control()[-3:] == [
            ("gap", 3, kept),
            ("replayed", False),
            ("clear", ClearReason.GAP),
        ]
        assert sink.markers() == [10, 11, 12, *range(10 + kept, 25)]
