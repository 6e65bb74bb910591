"""Proves the simulated engine publishes KV events as vLLM does, and breaks the stream on demand.

A real ZMQ SUB and a real replay DEALER on loopback talk to a running engine,
whose publisher is fed through its `KvEventSink` side as the prefix cache
feeds it. What they receive decodes to the events vLLM's own publishers sent
in the shared fixtures; each fault of `/sim/kv-events` is seen as a
subscriber sees it.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio

from headcount.config import ConfigError
from headcount.kvevents import (
    END_SEQ,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    Layout,
    decode_batch,
    encode_batch,
    frame_seq,
    parse_replay_reply,
    replay_end,
    replay_request,
)
from headcount.sim.engine import (
    EngineSimConfig,
    SimEngine,
    add_arguments,
    config_from_args,
    running_engine,
)
from headcount.sim.engine.kv_events_config import KvEventsConfig
from headcount.sim.engine.kv_publisher import KvEventPublisher
from tests.support import REPO, wait_until
from tests.support.kv_fixtures import expected_batches

LAYOUTS: list[Layout] = ["0.10", "current"]
VERSION_OF: dict[Layout, str] = {"0.10": "0.10.1", "current": "0.33.0"}
TIMEOUT_MS = 5000
README = REPO / "README.md"


class Subscriber:
    """What a router's subscriber holds: a SUB on the live stream, a DEALER for replay."""

    def __init__(self, publisher: KvEventPublisher) -> None:
        self.publisher = publisher
        context = zmq.asyncio.Context.instance()
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, publisher.config.topic.encode())
        self.sub.connect(publisher.endpoint)
        self.dealer = context.socket(zmq.DEALER)
        if publisher.replay_endpoint is not None:
            self.dealer.connect(publisher.replay_endpoint)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.dealer.close(linger=0)

    async def join(self) -> int:
        """Publish empty-cache batches until one arrives (a PUB sends nothing to a
        subscriber it has not seen yet), then read up to the last; its seq."""

        async def one_arrives() -> bool:
            self.publisher.cleared()
            self.publisher.end_step()
            return bool(await self.sub.poll(50))

        await wait_until(one_arrives, what="the SUB socket joined")
        await wait_until(lambda: self.publisher.status()["queued"] == 0)
        last: int = self.publisher.status()["next_seq"] - 1  # type: ignore[operator]
        while (seq := (await self.next())[0]) != last:
            assert seq < last
        return last

    async def next(self) -> tuple[int, EventBatch]:
        """The next live batch: its seq and its events, checking the frames' shape."""
        assert await self.sub.poll(TIMEOUT_MS), "no KV-event batch arrived"
        topic, seq, payload = await self.sub.recv_multipart()
        assert topic == self.publisher.config.topic.encode()
        return frame_seq(seq), decode_batch(payload)

    async def replay(self, start: int) -> list[list[bytes]]:
        """Every message of the reply to a replay from `start`, end marker included."""
        await self.dealer.send_multipart(replay_request(start))
        reply: list[list[bytes]] = []
        while not reply or parse_replay_reply(reply[-1])[0] != END_SEQ:
            assert await self.dealer.poll(TIMEOUT_MS), "the replay reply did not end"
            reply.append(await self.dealer.recv_multipart())
        return reply


def replayed_seqs(reply: list[list[bytes]]) -> list[int]:
    return [parse_replay_reply(frames)[0] for frames in reply]


def publish_steps(publisher: KvEventPublisher, steps: int) -> None:
    for step in range(steps):
        publisher.stored([1000 + step], None, list(range(16)), 16, None)
        publisher.end_step()


async def published(publisher: KvEventPublisher, count: int) -> None:
    """Wait until `count` batches have left the queue (numbered, buffered, sent or not)."""
    await wait_until(lambda: publisher.status()["next_seq"] == count, what=f"{count} batches")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
        yield client


def kv_engine(layout: Layout = "current", buffer_steps: int = 100) -> EngineSimConfig:
    settings = KvEventsConfig(port=0, replay_port=0, layout=layout, buffer_steps=buffer_steps)
    return EngineSimConfig(kv_events=settings)


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    async with running_engine(kv_engine()) as running:
        yield running


@pytest.fixture
async def subscriber(engine: SimEngine) -> AsyncIterator[Subscriber]:
    assert engine.kv_events is not None
    subscriber = Subscriber(engine.kv_events)
    yield subscriber
    subscriber.close()


@contextlib.asynccontextmanager
async def subscribed(config: EngineSimConfig) -> AsyncIterator[Subscriber]:
    """A subscriber (not joined yet) to a running engine's publisher."""
    async with running_engine(config) as engine:
        assert engine.kv_events is not None
        subscriber = Subscriber(engine.kv_events)
        try:
            yield subscriber
        finally:
            subscriber.close()


async def set_faults(
    session: aiohttp.ClientSession, engine: SimEngine, **faults: object
) -> dict[str, Any]:
    async with session.post(f"{engine.url}/sim/kv-events", json=faults) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


def as_the_simulator_sends(event: KvEvent, layout: Layout) -> KvEvent:
    """A fixture's event with what a real 0.33 engine adds and the 0.33 fixture leaves out."""
    if layout == "0.10":
        return event
    if isinstance(event, BlockStored):
        extra = None if event.lora_name is None else (event.lora_name,)
        return msgspec.structs.replace(
            event, extra_keys=[extra] * len(event.block_hashes), group_idx=0
        )
    if isinstance(event, BlockRemoved):
        return msgspec.structs.replace(event, group_idx=0)
    return event


# ---------------------------------------------------------------- live frames


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_live_batches_decode_to_the_events_vllm_published_in_the_fixtures(
    layout: Layout,
) -> None:
    async with subscribed(kv_engine(layout)) as subscriber:
        publisher = subscriber.publisher
        base = await subscriber.join()
        # The fixtures' steps, fed as the prefix cache feeds them.
        publisher.stored([11, 12], None, list(range(100, 132)), 16, None)
        publisher.end_step()
        publisher.stored([13], 12, list(range(200, 216)), 16, None)
        publisher.removed([11])
        publisher.end_step()
        publisher.stored([21], None, list(range(200, 216)), 16, "sql-lora")
        publisher.end_step()
        publisher.cleared()
        publisher.end_step()
        fixture = expected_batches(VERSION_OF[layout])
        for step in range(4):
            seq, batch = await subscriber.next()
            assert seq == base + 1 + step
            expected = [as_the_simulator_sends(e, layout) for e in fixture[step].events]
            assert batch.events == expected
            assert batch.data_parallel_rank == 0


@pytest.mark.parametrize(
    ("layout", "on_the_wire"), [("0.10", [-1, -(2**63)]), ("current", [2**64 - 1, 2**63])]
)
async def test_high_hashes_go_out_signed_in_0_10_and_unsigned_in_current(
    layout: Layout, on_the_wire: list[int]
) -> None:
    async with subscribed(kv_engine(layout)) as subscriber:
        await subscriber.join()
        subscriber.publisher.stored([2**64 - 1], 2**63, list(range(16)), 16, None)
        subscriber.publisher.end_step()
        _, batch = await subscriber.next()
        stored = batch.events[0]
        assert isinstance(stored, BlockStored)
        assert [*stored.block_hashes, stored.parent_block_hash] == on_the_wire


# ---------------------------------------------------------------- replay


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_a_replay_from_0_after_more_than_the_buffer_starts_later_then_ends(
    layout: Layout,
) -> None:
    async with subscribed(kv_engine(layout, buffer_steps=3)) as subscriber:
        publish_steps(subscriber.publisher, 5)
        await published(subscriber.publisher, 5)
        reply = await subscriber.replay(0)
        assert replayed_seqs(reply) == [2, 3, 4, END_SEQ]
        assert reply[-1] == replay_end(layout)
        frames_per_batch = 3 if layout == "0.10" else 4
        assert all(len(frames) == frames_per_batch for frames in reply)
        for step, frames in zip((2, 3, 4), reply, strict=False):
            _, payload = parse_replay_reply(frames)
            batch = decode_batch(payload)
            assert batch.events[0].block_hashes == [1000 + step]  # type: ignore[union-attr]
            assert encode_batch(batch, layout) == payload


# ---------------------------------------------------------------- faults


async def test_dropped_batches_leave_a_gap_that_replay_fills(
    engine: SimEngine, subscriber: Subscriber, session: aiohttp.ClientSession
) -> None:
    base = await subscriber.join()
    assert (await set_faults(session, engine, drop=2))["drop"] == 2
    publish_steps(subscriber.publisher, 3)
    assert (await subscriber.next())[0] == base + 3
    assert replayed_seqs(await subscriber.replay(base + 1)) == [base + 1, base + 2, base + 3, -1]
    assert subscriber.publisher.status()["withheld"] == 2


async def test_a_silent_stream_sends_nothing_until_it_speaks_again(
    engine: SimEngine, subscriber: Subscriber, session: aiohttp.ClientSession
) -> None:
    base = await subscriber.join()
    await set_faults(session, engine, silent=True)
    publish_steps(subscriber.publisher, 2)
    await published(subscriber.publisher, base + 3)
    assert not await subscriber.sub.poll(0)
    await set_faults(session, engine, silent=False)
    publish_steps(subscriber.publisher, 1)
    assert (await subscriber.next())[0] == base + 3


async def test_a_restart_numbers_from_0_again_with_no_cleared_event_and_an_empty_buffer(
    engine: SimEngine, subscriber: Subscriber, session: aiohttp.ClientSession
) -> None:
    publisher = subscriber.publisher
    await subscriber.join()
    publisher.stored([5], None, list(range(16)), 16, None)  # a step the restart cuts short
    status = await set_faults(session, engine, restart=True)
    assert (status["next_seq"], status["buffered"]) == (0, 0)
    publisher.stored([6], None, list(range(16)), 16, None)
    publisher.end_step()
    seq, batch = await subscriber.next()
    assert seq == 0
    assert [type(e).__name__ for e in batch.events] == ["BlockStored"]
    assert batch.events[0].block_hashes == [6]  # type: ignore[union-attr]
    assert replayed_seqs(await subscriber.replay(0)) == [0, END_SEQ]


async def test_a_restart_empties_the_cache_and_drops_what_it_reported_meanwhile() -> None:
    resets: list[str] = []

    def reset_cache() -> None:  # a cache whose reset reports a clear, which must not go out
        resets.append("cache emptied")
        publisher.cleared()
        publisher.end_step()

    publisher = KvEventPublisher(KvEventsConfig(port=0), "127.0.0.1", reset_cache)
    publisher.start()
    subscriber = Subscriber(publisher)
    try:
        await subscriber.join()
        publisher.restart()
        publish_steps(publisher, 1)
        seq, batch = await subscriber.next()
        assert (seq, resets) == (0, ["cache emptied"])
        assert [type(e).__name__ for e in batch.events] == ["BlockStored"]
    finally:
        subscriber.close()
        await publisher.close()


async def test_a_shrunk_replay_buffer_replays_only_the_newest_batches(
    engine: SimEngine, subscriber: Subscriber, session: aiohttp.ClientSession
) -> None:
    publish_steps(subscriber.publisher, 3)
    await published(subscriber.publisher, 3)
    assert (await set_faults(session, engine, replay_buffer=1))["replay_buffer"] == 1
    assert replayed_seqs(await subscriber.replay(0)) == [2, END_SEQ]


async def test_replay_requests_go_unanswered_while_replay_is_off(
    engine: SimEngine, subscriber: Subscriber, session: aiohttp.ClientSession
) -> None:
    publish_steps(subscriber.publisher, 3)
    await published(subscriber.publisher, 3)
    await set_faults(session, engine, replay=False)
    await subscriber.dealer.send_multipart(replay_request(0))
    await wait_until(lambda: subscriber.publisher.status()["replays_ignored"] == 1)
    await set_faults(session, engine, replay=True)
    # The only reply is the second request's: from 1, not from 0.
    assert replayed_seqs(await subscriber.replay(1)) == [1, 2, END_SEQ]
    assert not await subscriber.dealer.poll(0)


async def test_a_replay_request_of_the_wrong_shape_gets_no_answer(
    subscriber: Subscriber,
) -> None:
    publish_steps(subscriber.publisher, 1)
    await published(subscriber.publisher, 1)
    await subscriber.dealer.send_multipart([b"", b"\x00" * 8, b"extra"])
    assert replayed_seqs(await subscriber.replay(0)) == [0, END_SEQ]


@pytest.mark.parametrize(
    "body",
    [
        {"drop": -1},
        {"drop": True},
        {"silent": 1},
        {"replay_buffer": "2"},
        {"restart": True, "x": 1},
    ],
)
async def test_a_wrong_fault_request_is_refused_whole(
    engine: SimEngine, session: aiohttp.ClientSession, body: dict[str, object]
) -> None:
    before = engine.kv_events.status() if engine.kv_events else None
    async with session.post(f"{engine.url}/sim/kv-events", json=body) as response:
        assert response.status == 400
        assert "error" in await response.json()
    assert engine.kv_events is not None and engine.kv_events.status() == before


# ---------------------------------------------------------------- where to subscribe, and flags


async def test_kv_event_sources_answers_as_vllm_0_33_with_the_bound_endpoints(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    assert engine.kv_events is not None
    async with session.get(f"{engine.url}/kv_event_sources") as response:
        sources = await response.json()
    assert sources == {
        "0": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": engine.kv_events.endpoint,
            "replay_endpoint": engine.kv_events.replay_endpoint,
            "buffer_steps": 100,
            "hwm": 100_000,
            "max_queue_size": 100_000,
            "topic": "kv-events",
        }
    }
    assert engine.kv_events.endpoint.startswith("tcp://127.0.0.1:")


async def test_a_0_10_engine_has_no_kv_event_sources_and_no_engine_publishes_by_default(
    session: aiohttp.ClientSession,
) -> None:
    async with running_engine(kv_engine("0.10")) as engine:
        async with session.get(f"{engine.url}/kv_event_sources") as response:
            assert response.status == 404
    async with running_engine(EngineSimConfig()) as engine:
        assert engine.kv_events is None
        async with session.get(f"{engine.url}/sim/kv-events") as response:
            assert response.status == 404


def parse(*argv: str) -> EngineSimConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_the_kv_event_flags_describe_the_publisher() -> None:
    assert parse().kv_events is None
    assert parse("--kv-events-port", "5557").kv_events == KvEventsConfig(port=5557)
    config = parse(
        "--kv-events-port=5557",
        "--kv-events-replay-port=5558",
        "--kv-events-format=0.10",
        "--kv-events-topic=",
        "--kv-events-buffer-steps=7",
    )
    assert config.kv_events == KvEventsConfig(5557, 5558, "0.10", "", 7)


@pytest.mark.parametrize(
    "argv",
    [
        ("--kv-events-replay-port", "5558"),
        ("--kv-events-topic", ""),
        ("--kv-events-port", "70000"),
        ("--kv-events-port", "1", "--kv-events-buffer-steps", "-1"),
    ],
)
def test_kv_event_flags_without_a_port_or_out_of_range_are_a_config_error(
    argv: tuple[str, ...],
) -> None:
    with pytest.raises(ConfigError):
        parse(*argv)


def test_every_kv_event_flag_is_documented_in_help_and_readme() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    help_text = " ".join(parser.format_help().split())
    readme = README.read_text()
    for flag in ("port", "replay-port", "format", "topic", "buffer-steps"):
        assert f"--kv-events-{flag}" in help_text and f"--kv-events-{flag}" in readme
    for default in ("default: off", "default: current", "default: kv-events", "10000"):
        assert default in help_text
    assert "/sim/kv-events" in readme


# ---------------------------------------------------------------- the cache's own events


async def test_the_prefix_cache_publishes_its_blocks_and_the_restart_fault_empties_it(
    session: aiohttp.ClientSession,
) -> None:
    settings = KvEventsConfig(port=0, replay_port=0)
    config = EngineSimConfig(kv_events=settings, kv_blocks=32, block_size=4)
    prompt = {"prompt": list(range(10)), "max_tokens": 1}
    async with running_engine(config) as engine:
        assert engine.kv_events is not None
        subscriber = Subscriber(engine.kv_events)
        try:
            await subscriber.join()
            async with session.post(f"{engine.url}/v1/completions", json=prompt) as response:
                assert response.status == 200
            _, batch = await subscriber.next()
            stored = [event for event in batch.events if isinstance(event, BlockStored)]
            assert [event.token_ids for event in stored] == [list(range(8))]  # 2 full blocks
            await set_faults(session, engine, restart=True)
            async with session.post(f"{engine.url}/v1/completions", json=prompt) as response:
                usage = (await response.json())["usage"]
            assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
        finally:
            subscriber.close()
