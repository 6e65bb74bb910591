"""Reading what routing needs of a body: the same answer on the loop and in a worker, and a
large or hostile body never parsed on the loop, never a 500.

The pool tests run real worker processes; the proxy tests route through an in-process
`Proxy` to raw engines that record the bytes they receive.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headcount._http.local import LocalRequest, LocalResponse
from headcount.config import ProxySettings
from headcount.proxy import Proxy, payload, start_server
from headcount.proxy.parsepool import ParsePool
from headcount.routing import (
    Policy,
    RoundRobin,
    RoutingName,
    make_policy,
    prompt_prefix_key,
    session_key,
)
from headcount.surfaces.metrics import Metrics
from tests.support import EngineConnection, raw_engine, ready_fleet, spec

TIMEOUT = 10.0
MODEL = "m"
NO_HEADERS: list[tuple[bytes, bytes]] = []
OVER_1_MIB = 1_200_000
"""Bytes of a body over the pool's large-body bound (1 MiB): it never takes the last worker."""


def no_header(_name: bytes) -> bytes | None:
    return None


def nested(depth: int) -> bytes:
    return b'{"model": "m", "x": ' + b"[" * depth + b"]" * depth + b"}"


def empty_arrays(size: int, model: str = "nope") -> bytes:
    """A body of `size` bytes or so of empty arrays: costly to parse, within every limit."""
    return b'{"model": "%s", "x": [' % model.encode() + b"[]," * (size // 3) + b"[]]}"


# -- read on the loop -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "outcome"),
    [
        (b'{"model": "m", "user": "u"}', ("m", None)),
        (b"{not json", payload.INVALID_JSON),
        (b"\xff\xfe", payload.INVALID_JSON),
        (nested(100_000), payload.TOO_DEEP),
        (b"[1]", payload.NOT_AN_OBJECT),
        (b'{"model": 7}', payload.MISSING_MODEL),
        (b'{"model": ""}', payload.MISSING_MODEL),
        (b'{"model": "m", "x": "\\ud800"}', payload.INVALID_UNICODE),
        ('{"model": "m", "x": "\\udfff"}'.encode("utf-16"), payload.INVALID_UNICODE),
        (b'{"model": "m", "x": "\\ud83d\\ude00 \\\\ud800"}', ("m", None)),
    ],
    ids=[
        "ok",
        "malformed",
        "not-utf",
        "100k-deep",
        "array",
        "number-model",
        "empty-model",
        "lone-surrogate",
        "lone-surrogate-utf-16",
        "surrogate-pair",
    ],
)
def test_a_body_is_read_to_a_model_or_a_reason(body: bytes, outcome: payload.Outcome) -> None:
    assert payload.read_payload(body, None, no_header) == outcome


def _verdict_of_json_loads(body: bytes) -> payload.Outcome:
    """What `read_payload` must say, by the standard library's own reading."""
    try:
        value = json.loads(body)
    except RecursionError:
        return payload.TOO_DEEP
    except ValueError:
        return payload.INVALID_JSON
    if not isinstance(value, dict):
        return payload.NOT_AN_OBJECT
    model = value.get("model")
    return (model, None) if isinstance(model, str) and model else payload.MISSING_MODEL


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    """JSON as clients send it and as they get it wrong: other encodings, a BOM, space
    around, trailing bytes, a cut."""
    value = draw(st.dictionaries(st.sampled_from(["model", "x"]), _JSON_VALUES) | _JSON_VALUES)
    text = draw(st.sampled_from(["", " ", "\n"])) + json.dumps(value)
    text += draw(st.sampled_from(["", " \r\n", "x", "}", "\x00"]))
    data = text.encode(draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32-le"])))
    return data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data


@settings(max_examples=400, deadline=None)
@given(body=_bodies())
def test_a_body_reads_as_json_loads_reads_it(body: bytes) -> None:
    # The loop's fast path (plain UTF-8, nothing around the value) must agree with
    # json.loads on everything, and hand anything else to it.
    assert payload.read_payload(body, None, no_header) == _verdict_of_json_loads(body)


def test_a_too_deep_body_is_a_reason_not_a_recursion_error() -> None:
    # A 100k-deep body once escaped as RecursionError: a 500 with a traceback in the log.
    assert payload.read_payload(nested(100_000), session_key, no_header) == payload.TOO_DEEP


# -- read in a worker -----------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_DOCUMENT = st.one_of(
    _JSON.map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries(
        {"model": st.text(max_size=10)},
        optional={
            "user": st.text(max_size=10) | st.integers(),
            "prompt": st.text(max_size=30) | st.lists(st.text(max_size=10), max_size=3),
            "messages": st.lists(
                st.fixed_dictionaries({"role": st.just("user"), "content": _JSON}), max_size=3
            ),
        },
    ).map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=40),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=st.lists(_DOCUMENT, min_size=1, max_size=25))
async def test_a_worker_reads_every_body_as_the_loop_would(bodies: list[bytes]) -> None:
    headers = [(b"x-session-id", b"s-1")]
    pool = ParsePool(workers=2, memory_limit=0)
    try:
        for body in bodies:
            for key_source in (None, session_key, prompt_prefix_key):
                inline = payload.read_payload(body, key_source, dict(headers).get)
                assert await pool.read(body, key_source, headers) == inline
    finally:
        await pool.close()


async def test_a_worker_answers_a_body_too_costly_for_its_memory_bound_with_too_complex() -> None:
    pool = ParsePool(workers=1, memory_limit=64 * 1024 * 1024)
    try:
        outcome = await asyncio.wait_for(pool.read(empty_arrays(6_000_000), None, []), TIMEOUT)
        assert outcome == payload.TOO_COMPLEX
        assert await pool.read(b'{"model": "after"}', None, []) == ("after", None)
    finally:
        await pool.close()


async def test_a_worker_that_died_is_replaced_without_failing_a_request() -> None:
    pool = ParsePool(workers=1, memory_limit=0)
    try:
        assert await pool.read(b'{"model": "a"}', None, []) == ("a", None)
        (worker,) = pool._idle
        worker.kill()
        await asyncio.wait_for(worker._process.wait(), TIMEOUT)
        assert await pool.read(b'{"model": "b"}', None, []) == ("b", None)
    finally:
        await pool.close()


async def test_a_reader_that_stops_waiting_leaves_the_worker_to_the_next() -> None:
    pool = ParsePool(workers=1, memory_limit=0)
    try:
        assert await pool.read(b'{"model": "warm"}', None, []) == ("warm", None)
        worker = pool._idle[0]
        slow = asyncio.ensure_future(pool.read(empty_arrays(3_000_000), None, []))
        # over 1 MiB, so it waits for the same worker (a small body gets a second lane)
        queued = asyncio.ensure_future(pool.read(empty_arrays(OVER_1_MIB, "q"), None, []))
        await asyncio.sleep(0)
        slow.cancel()  # its client left; the worker finishes that parse, then serves `queued`
        assert await asyncio.wait_for(queued, TIMEOUT) == ("q", None)
        assert pool._idle == [worker]  # the same worker: not killed for a client that left
    finally:
        await pool.close()


async def test_closing_the_pool_answers_waiting_reads_unavailable() -> None:
    pool = ParsePool(workers=1, memory_limit=0)
    busy = asyncio.ensure_future(pool.read(empty_arrays(3_000_000), None, []))
    waiting = asyncio.ensure_future(pool.read(empty_arrays(OVER_1_MIB, "w"), None, []))
    await asyncio.sleep(0)
    await pool.close()
    assert await asyncio.wait_for(waiting, TIMEOUT) == payload.UNAVAILABLE
    await asyncio.gather(busy, return_exceptions=True)


async def test_a_key_source_a_worker_cannot_import_is_read_on_the_loop() -> None:
    pool = ParsePool(workers=1, memory_limit=0)
    try:

        def by_model(document: Any, header: Callable[[bytes], bytes | None]) -> str | None:
            return f"key-{document['model']}"

        assert await pool.read(b'{"model": "k"}', by_model, []) == ("k", "key-k")
        assert pool._count == 0  # no worker was needed
    finally:
        await pool.close()


# -- through the proxy ----------------------------------------------------------------------


async def local_app(request: LocalRequest) -> LocalResponse:
    return LocalResponse(404, b"{}")


class Recorder:
    """A raw engine's script: records each request's body digest and answers 200 `ok`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.digests: list[str] = []

    async def __call__(self, conn: EngineConnection) -> None:
        while (request := await conn.read_request()) is not None:
            self.digests.append(hashlib.sha256(request[1]).hexdigest())
            answer = b'{"engine": "%s"}' % self.name.encode()
            await conn.send(
                b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer)
            )


@asynccontextmanager
async def proxied(
    recorders: list[Recorder], policy: Policy, settings: ProxySettings
) -> AsyncIterator[tuple[int, Proxy]]:
    async with raw_engine(recorders[0]) as first, raw_engine(recorders[-1]) as last:
        engines = [first, last][: len(recorders)]
        specs = [spec(e.url, url=e.url) for e in engines]
        fleet = ready_fleet(*specs, cards=({"id": MODEL},))
        proxy = Proxy(fleet, policy, settings, Metrics(lambda: fleet.snapshot), local_app)
        server = await start_server(proxy, "127.0.0.1", 0)
        try:
            yield server.sockets[0].getsockname()[1], proxy
        finally:
            await proxy.close()


async def post(port: int, body: bytes, *headers: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        extra = b"".join(header + b"\r\n" for header in headers)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\n%scontent-length: %d\r\n\r\n"
            % (extra, len(body))
        )
        writer.write(body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return int(head.split()[1]), await asyncio.wait_for(reader.readexactly(length), TIMEOUT)
    finally:
        writer.close()


LARGE = ProxySettings(max_body_size=32 * 1024 * 1024, inline_parse_max=64 * 1024)


async def test_a_large_body_is_read_off_the_loop_and_forwarded_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed_here: list[int] = []
    loads = json.loads

    def recording_loads(text: Any, **kwargs: Any) -> Any:
        parsed_here.append(len(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(json, "loads", recording_loads)
    recorder = Recorder("a")
    async with proxied([recorder], RoundRobin(), LARGE) as (port, _proxy):
        body = json.dumps({"model": MODEL, "messages": [{"content": "x" * 3_000_000}]}).encode()
        status, answer = await post(port, body)
        assert (status, answer) == (200, b'{"engine": "a"}')
        assert recorder.digests == [hashlib.sha256(body).hexdigest()]
        small = json.dumps({"model": MODEL}).encode()
        assert (await post(port, small))[0] == 200
    assert max(parsed_here) < LARGE.inline_parse_max  # the small one only


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (nested(100_000), 400, "invalid_json"),
        (b"{" + b" " * 200_000, 400, "invalid_json"),
        (empty_arrays(2_000_000), 404, "model_not_found"),
        (b"[" + b"0," * 100_000 + b"0]", 400, "invalid_request"),
    ],
    ids=["100k-deep", "truncated", "nested-arrays-unknown-model", "not-an-object"],
)
async def test_a_hostile_large_body_gets_a_clean_4xx(body: bytes, status: int, code: str) -> None:
    async with proxied([Recorder("a")], RoundRobin(), LARGE) as (port, _proxy):
        got, answer = await post(port, body)
        assert got == status
        assert json.loads(answer)["error"]["code"] == code


async def test_affinity_keys_are_the_same_whether_a_body_is_read_here_or_in_a_worker() -> None:
    a, b = Recorder("a"), Recorder("b")
    policy = make_policy(RoutingName.PREFIX, affinity_epsilon=1.0)
    async with proxied([a, b], policy, LARGE) as (port, proxy):
        for n in range(16):  # all on one engine by chance: 1 run in 2**15
            prompt = f"conversation {n} " * 80
            small = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
            large = {**small, "messages": [*small["messages"], {"content": "y" * 200_000}]}
            _, small_engine = await post(port, json.dumps(small).encode())
            _, large_engine = await post(port, json.dumps(large).encode())
            assert small_engine == large_engine
        assert a.digests and b.digests  # the keys did spread requests over both engines
        assert proxy.connections.bodies.held == 0
