"""Proves the simulated engine gives a router's stream resume what it needs, over real sockets.

An answer resumed after any k of its tokens, on any engine, goes on with exactly
the rest of it; and a stream breaks mid-way in the three ways a resuming router
must survive: reset (`die-mid-stream`, RST, read here on a raw socket as
ECONNRESET), cut inside an event then closed without HTTP's last chunk
(`truncate-mid-stream`), or silent with everything else answering
(`stall-mid-stream`), each after a chosen number of chunks. Everything listens
on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from headcount.sim.engine import (
    EngineSimConfig,
    SimEngine,
    add_arguments,
    config_from_args,
    running_engine,
)
from headcount.sim.engine.parsing import Kind
from headcount.sim.engine.tokens import answer_text, split
from tests.support import wait_until

__all__: list[str] = []

TIMEOUT = aiohttp.ClientTimeout(total=5)
TOKENS = 12
PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
MESSAGES = [{"role": "user", "content": "How does a router resume a broken stream?"}]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        yield client


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    async with running_engine(EngineSimConfig(name="engine-a")) as running:
        yield running


def request(kind: Kind, tokens: int = TOKENS, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "sim-model", "max_tokens": tokens, **extra}
    if kind == "chat":
        return {**body, "messages": MESSAGES}
    return {**body, "prompt": "A router resumes a stream when"}


def resumed(body: dict[str, Any], kind: Kind, relayed: str, tokens: int) -> dict[str, Any]:
    """`body` as a router resumes it after relaying `relayed`: vLLM's chat extensions, or
    the prompt followed by it; `tokens` left to generate."""
    limit = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if kind == "completion":
        return {**body, "prompt": body["prompt"] + relayed, limit: tokens}
    return {
        **body,
        "messages": [*body["messages"], {"role": "assistant", "content": relayed}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        limit: tokens,
    }


def delta(event: bytes) -> str:
    choice = json.loads(event)["choices"][0]
    return str(choice["text"] if "text" in choice else choice["delta"]["content"])


async def streamed_text(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> str:
    """A whole stream's text, checked to end with `[DONE]`."""
    async with session.post(url, json={**body, "stream": True}) as response:
        assert response.status == 200
        events = [line[6:].rstrip() async for line in response.content if line.startswith(b"data:")]
    assert events[-1] == b"[DONE]"
    return "".join(delta(event) for event in events[:-1])


async def next_event(response: aiohttp.ClientResponse) -> bytes:
    """The next SSE `data:` payload of a stream."""
    while not (line := await response.content.readline()).startswith(b"data: "):
        assert line.strip() == b"", line
    return line[6:].rstrip()


@dataclass(frozen=True)
class Exchange:
    """What a raw socket read of one request got, and how the connection ended."""

    head: bytes
    body: bytes
    reset: bool
    """ECONNRESET (RST), rather than an end of file (FIN)."""

    def dechunked(self) -> tuple[bytes, bool]:
        """The chunked body's payload, and whether its terminating zero-length chunk came."""
        payload, rest = b"", self.body
        while (end := rest.find(b"\r\n")) >= 0:
            size = int(rest[:end], 16)
            if size == 0:
                return payload, True
            payload += rest[end + 2 : end + 2 + size]
            rest = rest[end + 2 + size + 2 :]
        return payload, False


async def exchange(engine: SimEngine, path: str, body: object, request_id: str = "r") -> Exchange:
    """POST `body` on a raw socket and read until the connection ends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", engine.port)
    payload = json.dumps(body).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nx-request-id: {request_id}\r\n"
        "Connection: close\r\n\r\n".encode()
        + payload
    )
    received, reset = b"", False
    try:
        while data := await asyncio.wait_for(reader.read(65536), 5):
            received += data
    except ConnectionResetError:
        reset = True
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body_bytes = received.partition(b"\r\n\r\n")
    return Exchange(head, body_bytes, reset)


def same_second(reference: bytes, broken: bytes) -> bytes:
    """`reference` with the `created` stamp of `broken`, which may be a second later."""
    stamp = re.search(rb'"created":\d+', broken)
    assert stamp is not None
    return re.sub(rb'"created":\d+', stamp.group(0), reference)


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_a_stream_resumed_after_k_tokens_goes_on_word_for_word_on_another_engine(
    kind: Kind, session: aiohttp.ClientSession
) -> None:
    path = PATHS[kind]
    async with running_engine(EngineSimConfig()) as a, running_engine(EngineSimConfig()) as b:
        body = request(kind)
        whole = await streamed_text(session, a.url + path, body)
        assert whole == answer_text(body, kind, TOKENS)
        tokens = split(whole)
        assert len(tokens) == TOKENS
        for k in (1, 2, 5, TOKENS - 1):
            relayed = "".join(tokens[:k])
            again = resumed(body, kind, relayed, TOKENS - k)
            assert await streamed_text(session, b.url + path, again) == "".join(tokens[k:]), k


async def test_a_stream_that_died_resumes_on_another_engine_into_the_whole_answer(
    session: aiohttp.ClientSession,
) -> None:
    body = request("chat", stream=True)
    body["max_completion_tokens"] = body.pop("max_tokens")
    async with running_engine(EngineSimConfig(die_after_chunks=5, fail_mode="die-mid-stream")) as a:
        relayed = []
        async with session.post(a.url + PATHS["chat"], json=body) as response:
            with pytest.raises(aiohttp.ClientPayloadError):
                while True:
                    relayed.append(delta(await next_event(response)))
    assert len(relayed) == 5
    async with running_engine(EngineSimConfig()) as b:
        again = resumed(body, "chat", "".join(relayed), TOKENS - 5)
        rest = await streamed_text(session, b.url + PATHS["chat"], again)
    assert "".join(relayed) + rest == answer_text(body, "chat", TOKENS)


@pytest.mark.parametrize("after_chunks", [0, 3])
async def test_die_mid_stream_resets_the_connection_after_the_chunks_asked_for(
    after_chunks: int, engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    url = f"{engine.url}/sim/fail-mode"
    answer = {"mode": "die-mid-stream", "after_chunks": after_chunks}
    async with session.post(url, json=answer) as response:
        assert response.status == 200 and await response.json() == answer
    got = await exchange(engine, PATHS["chat"], request("chat", stream=True))
    assert got.reset and got.head.startswith(b"HTTP/1.1 200")
    payload, terminated = got.dechunked()
    assert not terminated
    events = payload.split(b"\n\n")
    assert events[-1] == b"" and len(events) - 1 == after_chunks
    whole = await exchange(engine, PATHS["completion"], request("completion"))
    assert whole.reset and whole.head == whole.body == b""  # not even a status line
    assert engine.stats()["served"] == 0


async def test_a_stream_shorter_than_the_chunks_before_death_ends_normally(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    await engine.set_fail_mode("die-mid-stream", after_chunks=5)
    body = request("completion", tokens=3)
    assert await streamed_text(session, engine.url + PATHS["completion"], body) == answer_text(
        body, "completion", 3
    )


async def test_truncate_mid_stream_cuts_the_next_event_in_half_and_closes_unterminated(
    engine: SimEngine,
) -> None:
    body = request("chat", stream=True)
    reference = await exchange(engine, PATHS["chat"], body)
    full, terminated = reference.dechunked()
    assert terminated and not reference.reset
    await engine.set_fail_mode("truncate-mid-stream", after_chunks=3)
    got = await exchange(engine, PATHS["chat"], body)
    assert not got.reset and got.head.startswith(b"HTTP/1.1 200")
    payload, terminated = got.dechunked()
    assert not terminated
    *events, cut = payload.split(b"\n\n")
    assert len(events) == 3
    next_event = same_second(full, payload).split(b"\n\n")[3] + b"\n\n"
    assert cut == next_event[: len(next_event) // 2] and cut.startswith(b'data: {"id":')
    with pytest.raises(ValueError):
        json.loads(cut[6:])


async def test_truncate_mid_stream_sends_half_a_whole_answer_under_its_whole_length(
    engine: SimEngine,
) -> None:
    body = request("completion")
    reference = await exchange(engine, PATHS["completion"], body)
    await engine.set_fail_mode("truncate-mid-stream")
    got = await exchange(engine, PATHS["completion"], body)
    assert not got.reset and got.head.startswith(b"HTTP/1.1 200")
    length = re.search(rb"(?i)content-length: (\d+)", got.head)
    assert length is not None and int(length.group(1)) == len(reference.body)
    assert got.body == same_second(reference.body, got.body)[: len(reference.body) // 2]
    assert engine.stats()["served"] == 1  # the reference only


async def test_stall_mid_stream_holds_streams_while_everything_else_answers(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    await engine.set_fail_mode("stall-mid-stream", after_chunks=2)
    url = engine.url + PATHS["chat"]
    body = request("chat", stream=True)
    expected = answer_text(body, "chat", TOKENS)
    async with session.post(url, json=body) as first, session.post(url, json=body) as second:
        held = [[await next_event(stream) for _ in range(2)] for stream in (first, second)]
        for path in ("/health", "/metrics", "/v1/models"):
            async with session.get(engine.url + path) as response:
                assert response.status == 200
        async with session.post(url, json=request("chat")) as whole:
            answer = await whole.json()
        assert answer["choices"][0]["message"]["content"] == expected
        assert engine.stats()["running"] == 2
        with pytest.raises(TimeoutError):  # nothing more on a stalled stream
            await asyncio.wait_for(next_event(first), 0.2)
        await engine.set_fail_mode("none")
        for stream, events in zip((first, second), held, strict=True):
            while events[-1] != b"[DONE]":
                events.append(await next_event(stream))
            assert "".join(delta(event) for event in events[:-1]) == expected
    await wait_until(lambda: engine.stats()["running"] == 0, what="the streams to end")


async def test_a_stalled_stream_breaks_when_the_mode_turns_to_die(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    await engine.set_fail_mode("stall-mid-stream", after_chunks=1)
    async with session.post(
        engine.url + PATHS["completion"], json=request("completion", stream=True)
    ) as stream:
        await next_event(stream)
        await wait_until(lambda: engine.stats()["running"] == 1, what="the stream to stall")
        await engine.set_fail_mode("die-mid-stream", after_chunks=1)
        with pytest.raises(aiohttp.ClientPayloadError):
            await stream.read()


async def test_after_chunks_is_refused_where_it_means_nothing(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    url = f"{engine.url}/sim/fail-mode"
    for bad in (
        {"mode": "hang", "after_chunks": 1},
        {"mode": "die-mid-stream", "after_chunks": -1},
        {"mode": "stall-mid-stream", "after_chunks": True},
        {"mode": "truncate-mid-stream", "after_chunks": "3"},
    ):
        async with session.post(url, json=bad) as response:
            assert response.status == 400, bad
            assert (await response.json())["error"]["type"] == "BadRequestError"
    assert engine.fail_mode == "none"
    with pytest.raises(ValueError):
        await engine.set_fail_mode("http-500", after_chunks=1)
    async with session.post(url, json={"mode": "truncate-mid-stream"}) as response:
        assert await response.json() == {"mode": "truncate-mid-stream", "after_chunks": 2}
    async with session.get(f"{engine.url}/sim/stats") as response:
        stats = await response.json()
    assert (stats["fail_mode"], stats["after_chunks"]) == ("truncate-mid-stream", 2)
    with pytest.raises(ValueError):
        EngineSimConfig(die_after_chunks=-1)


def test_the_command_line_sets_the_new_modes_and_their_chunk_count() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = ["--fail-mode", "stall-mid-stream", "--die-after-chunks", "4"]
    config = config_from_args(parser.parse_args(args))
    assert (config.fail_mode, config.die_after_chunks) == ("stall-mid-stream", 4)
    with pytest.raises(SystemExit):
        parser.parse_args(["--die-after-chunks", "-1"])
