"""A stream whose engine breaks mid-answer is resumed on another engine, as one stream.

Engines here are raw scripts (`raw_engine`) that send exact chunks, so each
trigger (a reset, a truncated event, a malformed chunk, a stall, the engine
leaving the fleet) and each refusal is produced exactly, and the engine that
continues shows the request it got. The simulator's resumed answers are
checked word for word in `test_stream_resume_sim.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from headcount.config import ProxySettings
from headcount.fleet import Engine
from headcount.routing import RequestFeatures
from headcount.sim.cluster.polling import wait_until
from tests.support.raw_engine import EngineConnection, raw_engine
from tests.support.routed import CHAT, MODEL, TIMEOUT, Routed, routed

COMPLETIONS = "/v1/completions"
SETTINGS = ProxySettings(connect_timeout=1.0, read_timeout=5.0, stream_resume_limit=2)
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


class InOrder:
    """Routes to the first of `order` among the candidates: who breaks, who resumes."""

    name = "in-order"
    key_source = None

    def __init__(self) -> None:
        self.order: list[str] = []

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None:
        ids = {engine.id: engine for engine in candidates}
        return next((ids[i] for i in self.order if i in ids), None)


def event(payload: dict[str, Any] | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@dataclass
class Answer:
    """One engine's answer, as vLLM shapes its chunks: chat or completion, under its own ids."""

    name: str
    kind: str = "chat"

    def chunk(
        self,
        text: str | None = None,
        *,
        role: bool = False,
        finish: str | None = None,
        usage: dict[str, int] | None = None,
        tool_call: bool = False,
    ) -> bytes:
        fields: dict[str, Any] = {
            "id": f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{self.name}",
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": 1000 + ord(self.name[0]),
            "model": MODEL,
            "system_fingerprint": f"fp-{self.name}",
        }
        if text is None and usage is not None:
            fields["choices"] = []
        elif self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if tool_call:
                delta["tool_calls"] = [{"index": 0, "function": {"arguments": '{"ci'}}]
            else:
                delta["content"] = text or ""
            fields["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        else:
            fields["choices"] = [{"index": 0, "text": text or "", "finish_reason": finish}]
        if usage is not None:
            fields["usage"] = usage
        return event(fields)

    def tokens(self, words: Sequence[str], *, first: bool) -> list[bytes]:
        chunks = [self.chunk("", role=True)] if first and self.kind == "chat" else []
        return chunks + [self.chunk(word) for word in words]


Behaviour = Callable[[EngineConnection, dict[str, Any]], Awaitable[None]]


@dataclass
class Scripted:
    """A raw engine answering its n-th request with the n-th behaviour; the bodies it got."""

    behaviours: list[Behaviour]
    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, conn: EngineConnection) -> None:
        while (request := await conn.read_request()) is not None:
            self.bodies.append(json.loads(request[1]))
            behaviour = self.behaviours[min(len(self.bodies), len(self.behaviours)) - 1]
            await behaviour(conn, self.bodies[-1])


def reset(conn: EngineConnection) -> None:
    """Close with a RST, as a crashed engine's kernel does."""
    sock = conn.writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.writer.transport.abort()


def breaks(chunks: Sequence[bytes], how: str = "reset", after: bytes = b"") -> Behaviour:
    """Send the head and `chunks` (one HTTP chunk each), then break: `reset`, `close`
    (`after` sent raw first: half an event, a malformed chunk), or `stall` (forever)."""

    async def behave(conn: EngineConnection, _body: dict[str, Any]) -> None:
        await conn.send(STREAM_HEAD + b"".join(chunked(c) for c in chunks))
        await conn.until_read()
        if after:
            await conn.send(after)
            await conn.until_read()
        if how == "reset":
            reset(conn)
        elif how == "stall":
            await asyncio.Event().wait()
        else:
            conn.writer.close()

    return behave


def answers(chunks: Sequence[bytes], status: int = 200) -> Behaviour:
    """A whole stream (`[DONE]` included), or a JSON error of `status`."""

    async def behave(conn: EngineConnection, _body: dict[str, Any]) -> None:
        if status != 200:
            body = b'{"error":{"message":"no","type":"BadRequestError","code":%d}}' % status
            head = b"HTTP/1.1 %d No\r\ncontent-type: application/json\r\n" % status
            await conn.send(head + b"content-length: %d\r\n\r\n%b" % (len(body), body))
            return
        data = b"".join(chunked(c) for c in [*chunks, b"data: [DONE]\n\n"])
        await conn.send(STREAM_HEAD + data + b"0\r\n\r\n")

    return behave


@dataclass
class Setup:
    routed: Routed
    engines: list[Scripted]


@asynccontextmanager
async def engines(*scripts: Scripted, settings: ProxySettings = SETTINGS) -> AsyncIterator[Setup]:
    async with AsyncExitStack() as stack:
        raws = [await stack.enter_async_context(raw_engine(script)) for script in scripts]
        policy = InOrder()
        setup = await stack.enter_async_context(
            routed(extra_urls=[raw.url for raw in raws], settings=settings, policy=policy)
        )
        policy.order = setup.engine_ids
        yield Setup(setup, list(scripts))


@dataclass
class Received:
    events: list[dict[str, Any]]
    done: int
    broken: bool

    @property
    def text(self) -> str:
        parts = []
        for chunk in self.events:
            for choice in chunk.get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or choice.get("text") or "")
        return "".join(parts)

    @property
    def finishes(self) -> list[str]:
        return [
            choice["finish_reason"]
            for chunk in self.events
            for choice in chunk.get("choices", [])
            if choice.get("finish_reason") is not None
        ]


async def stream(setup: Setup, body: dict[str, Any], path: str = CHAT) -> Received:
    """Post a streamed request and read every event the client gets, broken or not."""
    raw = b""
    broken = False
    session = setup.routed.session
    async with session.post(setup.routed.url + path, json={"stream": True, **body}) as response:
        assert response.status == 200
        try:
            async for piece in response.content.iter_any():
                raw += piece
        except aiohttp.ClientPayloadError:
            broken = True
    assert raw.endswith(b"\n\n"), raw[-200:]  # never half an event
    payloads = [e[len(b"data: ") :] for e in raw.split(b"\n\n") if e]
    events = [json.loads(p) for p in payloads if p != b"[DONE]"]
    return Received(events, payloads.count(b"[DONE]"), broken)


def sample(setup: Setup, name: str, **labels: str) -> float:
    return setup.routed.sample(name, **labels)


A, B, C = Answer("a"), Answer("b"), Answer("c")
ASKED = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 10,
    "temperature": 0.7,
    "stop": ["\n\n"],
    "seed": 7,
    "user": "u-1",
}


def assert_one_stream(received: Received, text: str) -> None:
    """Every chunk under the first engine's ids, the text whole, one finish, one [DONE]."""
    assert received.text == text
    assert not received.broken and received.done == 1
    assert received.finishes == ["length"]
    for chunk in received.events:
        assert (chunk["id"], chunk["created"], chunk["system_fingerprint"]) == (
            "chatcmpl-a",
            1000 + ord("a"),
            "fp-a",
        )
    roles = [c for c in received.events for ch in c["choices"] if "role" in ch.get("delta", {})]
    assert len(roles) == 1


CONTINUATION = [B.chunk("", role=True), B.chunk(" four"), B.chunk(" five", finish="length")]


@pytest.mark.parametrize(
    ("how", "after"),
    [
        ("reset", b""),
        ("close", chunked(A.chunk(" fou")[:30])),  # a truncated event, then FIN
        ("close", b"zz\r\n"),  # a malformed chunk size
    ],
    ids=["reset", "truncated", "malformed"],
)
async def test_a_broken_chat_stream_is_resumed_as_one_stream(how: str, after: bytes) -> None:
    first = Scripted([breaks(A.tokens([" one", " two", " three"], first=True), how, after)])
    second = Scripted([answers(CONTINUATION)])
    async with engines(first, second) as setup:
        received = await stream(setup, ASKED)
        assert_one_stream(received, " one two three four five")
        asked = second.bodies[0]
        assert asked["messages"] == [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": " one two three"},
        ]
        assert asked["continue_final_message"] is True
        assert asked["add_generation_prompt"] is False
        assert asked["max_tokens"] == 7  # three tokens relayed
        kept = {"temperature": 0.7, "stop": ["\n\n"], "seed": 7, "user": "u-1", "stream": True}
        assert {name: asked[name] for name in kept} == kept
        await wait_until(setup.routed.all_released, timeout=TIMEOUT)
        assert sample(setup, "headcount_stream_resumes_total", model=MODEL, outcome="resumed") == 1
        code = {"model": MODEL, "code": "200"}
        assert sample(setup, "headcount_requests_total", outcome="resumed", **code) == 1
        assert sample(setup, "headcount_requests_total", outcome="cut", **code) == 0
        assert sample(setup, "headcount_stream_resume_gap_seconds_count", model=MODEL) == 1


async def test_a_stalled_stream_is_resumed_after_the_read_timeout() -> None:
    first = Scripted([breaks(A.tokens([" one"], first=True), "stall")])
    second = Scripted([answers(CONTINUATION)])
    settings = ProxySettings(connect_timeout=1.0, read_timeout=0.3)
    async with engines(first, second, settings=settings) as setup:
        received = await stream(setup, ASKED)
        assert_one_stream(received, " one four five")
        assert second.bodies[0]["max_tokens"] == 9
        gap = sample(setup, "headcount_stream_resume_gap_seconds_sum", model=MODEL)
        assert settings.read_timeout * 0.9 <= gap < 3.0  # the silence the client sat through


@pytest.mark.parametrize("leaves", ["ejected", "removed"])
async def test_a_stream_whose_engine_leaves_is_resumed_at_once(leaves: str) -> None:
    left = asyncio.Event()

    async def streams_until_told(conn: EngineConnection, _body: dict[str, Any]) -> None:
        chunks = A.tokens([" one", " two"], first=True)
        await conn.send(STREAM_HEAD + b"".join(chunked(c) for c in chunks))
        await left.wait()
        await asyncio.Event().wait()  # still streaming, as a pod being deleted may

    first = Scripted([streams_until_told])
    second = Scripted([answers(CONTINUATION)])
    async with engines(first, second) as setup:  # read timeout 5 s: not what resumes it
        reading = asyncio.ensure_future(stream(setup, ASKED))
        fleet = setup.routed.fleet
        first_id = setup.routed.engine_ids[0]
        await wait_until(lambda: fleet.snapshot.by_id[first_id].load.in_flight == 1, timeout=5)
        await wait_until(lambda: bool(setup.routed.proxy._streaming.get(first_id)), timeout=5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        if leaves == "ejected":
            fleet.eject(first_id, "test: ejected while streaming")
        else:
            fleet.remove(first_id, "test: its pod was deleted")
        received = await asyncio.wait_for(reading, TIMEOUT)
        assert loop.time() - started < 2.0
        left.set()
        assert_one_stream(received, " one two four five")


async def test_a_completion_continues_after_its_prompt_with_its_default_limit() -> None:
    a, b = Answer("a", "completion"), Answer("b", "completion")
    first = Scripted([breaks([a.chunk(" one"), a.chunk(" two")])])
    second = Scripted([answers([b.chunk(" three", finish="length")])])
    async with engines(first, second) as setup:
        received = await stream(setup, {"model": MODEL, "prompt": "Count:"}, COMPLETIONS)
        assert received.text == " one two three" and received.done == 1
        assert {chunk["id"] for chunk in received.events} == {"cmpl-a"}
        assert second.bodies[0]["prompt"] == "Count: one two"
        assert second.bodies[0]["max_tokens"] == 14  # vLLM's default 16, less two relayed
        assert "continue_final_message" not in second.bodies[0]


async def test_usage_counts_the_whole_answer_from_the_original_prompt() -> None:
    usage = {"prompt_tokens": 12, "total_tokens": 14, "completion_tokens": 2}
    first = Scripted([breaks(A.tokens([" one", " two", " three"], first=True))])
    second = Scripted(
        [answers([*CONTINUATION[:2], B.chunk(" five", finish="length"), B.chunk(usage=usage)])]
    )
    async with engines(first, second) as setup:
        body = {**ASKED, "stream_options": {"include_usage": True}}
        received = await stream(setup, body)
        assert received.text == " one two three four five"
        usages = [chunk["usage"] for chunk in received.events if chunk.get("usage")]
        # The continuation's prompt held the three relayed tokens: 9 were the original's.
        assert usages == [{"prompt_tokens": 9, "total_tokens": 14, "completion_tokens": 5}]
        assert second.bodies[0]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("changes", "chunks", "reason"),
    [
        ({"n": 2}, None, "n"),
        ({"logprobs": True, "top_logprobs": 2}, None, "logprobs"),
        ({"response_format": {"type": "json_schema"}}, None, "structured_output"),
        ({}, [A.chunk("", role=True), A.chunk(tool_call=True)], "tool_call"),
        ({}, [*A.tokens([" one"], first=True), A.chunk(" two", finish="stop")], "finished"),
    ],
    ids=["n", "logprobs", "schema", "tool-call", "finished"],
)
async def test_a_stream_that_cannot_be_resumed_exactly_is_cut_with_an_error_event(
    changes: dict[str, Any], chunks: list[bytes] | None, reason: str
) -> None:
    first = Scripted([breaks(chunks or A.tokens([" one"], first=True))])
    second = Scripted([answers(CONTINUATION)])
    async with engines(first, second) as setup:
        received = await stream(setup, {**ASKED, **changes})
        assert received.broken and received.done == 0
        assert received.events[-1]["error"]["type"] == "upstream_error"
        assert second.bodies == []
        await wait_until(setup.routed.all_released, timeout=TIMEOUT)
        refused = f"refused_{reason}"
        assert sample(setup, "headcount_stream_resumes_total", model=MODEL, outcome=refused) == 1
        code = {"model": MODEL, "code": "200"}
        assert sample(setup, "headcount_requests_total", outcome="cut", **code) == 1


async def test_a_completion_prompt_of_token_ids_is_not_resumed() -> None:
    a = Answer("a", "completion")
    first = Scripted([breaks([a.chunk(" one")])])
    second = Scripted([answers([a.chunk(" two", finish="length")])])
    async with engines(first, second) as setup:
        received = await stream(setup, {"model": MODEL, "prompt": [1, 2, 3]}, COMPLETIONS)
        assert received.broken and second.bodies == []
        outcome = "refused_prompt"
        assert sample(setup, "headcount_stream_resumes_total", model=MODEL, outcome=outcome) == 1


async def test_a_continuation_that_fails_is_resumed_again_then_cut_at_the_limit() -> None:
    first = Scripted([breaks(A.tokens([" one"], first=True))])
    refusing = Scripted([answers([], status=400)])
    breaking = Scripted([breaks([B.chunk("", role=True), B.chunk(" two")])])
    last = Scripted([answers([C.chunk(" three", finish="length")])])
    three = ProxySettings(connect_timeout=1.0, read_timeout=5.0, stream_resume_limit=3)
    async with engines(first, refusing, breaking, last, settings=three) as setup:
        received = await stream(setup, ASKED)
        assert_one_stream(received, " one two three")
        assert breaking.bodies[0]["messages"][-1]["content"] == " one"
        assert last.bodies[0]["messages"][-1]["content"] == " one two"
        assert last.bodies[0]["max_tokens"] == 8
        resumes = {
            outcome: sample(setup, "headcount_stream_resumes_total", model=MODEL, outcome=outcome)
            for outcome in ("resumed", "failed")
        }
        assert resumes == {"resumed": 2, "failed": 1}  # the 400 began no continuation
    first = Scripted([breaks(A.tokens([" one"], first=True))])
    breaking = Scripted([breaks([B.chunk("", role=True), B.chunk(" two")])])
    last = Scripted([answers([C.chunk(" three", finish="length")])])
    settings = ProxySettings(connect_timeout=1.0, read_timeout=5.0, stream_resume_limit=1)
    async with engines(first, breaking, last, settings=settings) as setup:
        received = await stream(setup, ASKED)
        assert received.broken and received.text == " one two" and last.bodies == []
        assert received.events[-1]["error"]["code"] == "upstream_failed"
        refused = "refused_limit"
        assert sample(setup, "headcount_stream_resumes_total", model=MODEL, outcome=refused) == 1


async def test_with_resume_off_a_broken_stream_is_cut_as_before() -> None:
    first = Scripted([breaks(A.tokens([" one"], first=True))])
    second = Scripted([answers(CONTINUATION)])
    off = ProxySettings(connect_timeout=1.0, read_timeout=5.0, stream_resume_limit=0)
    async with engines(first, second, settings=off) as setup:
        received = await stream(setup, ASKED)
        assert received.broken and received.text == " one" and second.bodies == []
        assert not any("error" in chunk for chunk in received.events)


def breaks_whole(body: bytes) -> Behaviour:
    """An unstreamed answer cut after its first half."""

    async def behave(conn: EngineConnection, _body: dict[str, Any]) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        await conn.send(head + b"content-length: %d\r\n\r\n" % len(body) + body[: len(body) // 2])
        await conn.until_read()
        reset(conn)

    return behave


def whole(body: bytes) -> Behaviour:
    async def behave(conn: EngineConnection, _body: dict[str, Any]) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        await conn.send(head + b"content-length: %d\r\n\r\n%b" % (len(body), body))

    return behave


async def test_an_unstreamed_answer_broken_before_the_client_got_it_is_asked_again() -> None:
    answer = json.dumps({"id": "chatcmpl-b", "choices": [{"message": {"content": "hi"}}]})
    first = Scripted([breaks_whole(answer.encode())])
    second = Scripted([whole(answer.encode())])
    async with engines(first, second) as setup:
        status, body, _ = await setup.routed.post(CHAT, ASKED)
        assert status == 200 and body == json.loads(answer)
        assert second.bodies == [ASKED]  # asked again as it was
        outcome = "retried"
        assert sample(setup, "headcount_stream_resumes_total", model=MODEL, outcome=outcome) == 1
    off = ProxySettings(connect_timeout=1.0, read_timeout=5.0, stream_resume_limit=0)
    first = Scripted([breaks_whole(answer.encode())])
    second = Scripted([whole(answer.encode())])
    async with engines(first, second, settings=off) as setup:
        async with setup.routed.session.post(setup.routed.url + CHAT, json=ASKED) as response:
            assert response.status == 200  # relayed as it came: then it broke
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
        assert second.bodies == []


async def test_a_stream_broken_after_its_done_event_ends_whole() -> None:
    done = [*A.tokens([" one"], first=True), A.chunk(" two", finish="length"), b"data: [DONE]\n\n"]
    first = Scripted([breaks(done)])
    second = Scripted([answers(CONTINUATION)])
    async with engines(first, second) as setup:
        received = await stream(setup, ASKED)
        assert_one_stream(received, " one two")
        assert second.bodies == []
        await wait_until(setup.routed.all_released, timeout=TIMEOUT)
        code = {"model": MODEL, "code": "200"}
        assert sample(setup, "headcount_requests_total", outcome="ok", **code) == 1


async def test_a_resume_is_logged_once_and_its_access_line_names_the_engines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = Scripted([breaks(A.tokens([" one", " two"], first=True))])
    second = Scripted([answers(CONTINUATION)])
    caplog.set_level(logging.INFO)
    async with engines(first, second) as setup:
        await stream(setup, ASKED)
        await wait_until(setup.routed.all_released, timeout=TIMEOUT)
        broken, resumed_on = setup.routed.engine_ids[:2]
    lines = [r.getMessage() for r in caplog.records if r.name == "headcount.proxy.exchange"]
    assert len(lines) == 1
    assert f"resumed on engine {resumed_on}" in lines[0]
    assert "2 tokens carried over (resume 1 of at most 2)" in lines[0]
    access = [r for r in caplog.records if r.name == "headcount.access"]
    assert [(r.outcome, r.resumed_from, r.engine) for r in access] == [  # type: ignore[attr-defined]
        ("resumed", broken, resumed_on)
    ]


async def test_a_stream_with_no_other_engine_or_too_large_a_body_is_cut_and_counted() -> None:
    first = Scripted([breaks(A.tokens([" one"], first=True))])
    async with engines(first) as setup:
        received = await stream(setup, ASKED)
        assert received.broken and received.events[-1]["error"]["type"] == "upstream_error"
        refused = "refused_no_engine"
        assert sample(setup, "headcount_stream_resumes_total", model=MODEL, outcome=refused) == 1
    first = Scripted([breaks(A.tokens([" one"], first=True))])
    second = Scripted([answers(CONTINUATION)])
    large = ProxySettings(connect_timeout=1.0, read_timeout=5.0, max_body_size=2 * 1024 * 1024)
    async with engines(first, second, settings=large) as setup:
        long = {**ASKED, "messages": [{"role": "user", "content": "x" * (1024 * 1024)}]}
        received = await stream(setup, long)
        assert received.broken and second.bodies == []
        refused = "refused_large_body"
        assert sample(setup, "headcount_stream_resumes_total", model=MODEL, outcome=refused) == 1
