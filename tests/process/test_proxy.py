"""The proxy end to end: real clients, the router on 127.0.0.1, simulated engines behind it.

Engines are `headcount.sim.engine` instances (real aiohttp servers) or, where a
test needs to see or send exact bytes, the scripted `RawEngine` of
tests/support/raw_engine.py. Clients are aiohttp, raw sockets, the official
`openai` SDK and curl. The fleet is built as discovery would build it, then
marked probed.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest

from headcount._http.pool import Dial
from headcount.config import OutlierSettings, ProbeSettings, ProxySettings, RoutingName
from headcount.fleet import EngineState, ProbeResult
from headcount.routing import make_policy
from headcount.sim.engine import EngineSimConfig
from tests.support import EngineConnection, Script, blackholed_listener, raw_engine, wait_until
from tests.support.routed import CHAT, MODEL, SETTINGS, TIMEOUT, Routed, Silent, chat, routed, sim

RELEASE_TIMEOUT = 3.0
"""Under the read timeout: an engine released in time was released by the disconnect."""


# -- the API through the router -------------------------------------------------------------


async def test_chat_completions_and_embeddings_are_proxied_round_robin() -> None:
    async with routed(sim("a"), sim("b")) as setup:
        names = set()
        for _ in range(4):
            status, body, headers = await setup.post(CHAT, chat())
            assert status == 200
            assert body["object"] == "chat.completion"
            names.add(headers["x-engine-name"])
        assert names == {"a", "b"}
        status, body, _ = await setup.post("/v1/completions", {"model": MODEL, "prompt": "hi"})
        assert (status, body["object"]) == (200, "text_completion")
        status, body, _ = await setup.post("/v1/embeddings", {"model": MODEL, "input": "hi"})
        assert status == 200 and len(body["data"][0]["embedding"]) > 0
        assert setup.loads() == [(0, 3, 0), (0, 3, 0)]
        assert setup.sample("headcount_requests_total", model=MODEL, code="200", outcome="ok") == 6


async def test_in_flight_is_held_during_a_stream_and_released_after() -> None:
    async with routed(sim("a", token_delay=0.02)) as setup:
        async with setup.session.post(setup.url + CHAT, json=chat(stream=True)) as response:
            await response.content.readuntil(b"\n\n")
            assert setup.loads()[0][0] == 1
            assert setup.proxy.in_flight == 1
            await response.read()
        await wait_until(setup.all_released, timeout=TIMEOUT)
        assert setup.loads() == [(0, 1, 0)]


async def test_stream_chunks_pass_through_as_they_are_generated() -> None:
    async with routed(sim("a", token_delay=0.05)) as setup:
        arrivals = []
        payload = chat(stream=True, max_tokens=5)
        async with setup.session.post(setup.url + CHAT, json=payload) as response:
            started = time.monotonic()
            async for _ in response.content.iter_chunks():
                arrivals.append(time.monotonic() - started)
        assert len(arrivals) >= 5  # not buffered into one piece
        assert arrivals[-1] - arrivals[0] > 0.15  # spread over the generation, as sent


async def test_large_bodies_pass_through_byte_for_byte() -> None:
    big_response = bytes(range(256)) * (8 * 1024 * 4)  # 8 MiB, forces flow control

    async def script(conn: EngineConnection) -> None:
        while (request := await conn.read_request()) is not None:
            digest = hashlib.sha256(request[1]).hexdigest().encode()
            await conn.send(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-digest: %s\r\n\r\n" % digest
            )
            for offset in range(0, len(big_response), 1 << 20):
                piece = big_response[offset : offset + (1 << 20)]
                await conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            await conn.send(b"0\r\n\r\n")

    async with raw_engine(script) as engine, routed(extra_urls=[engine.url]) as setup:
        request = json.dumps(chat(padding="p" * 50_000)).encode()
        async with setup.session.post(
            setup.url + CHAT, data=request, headers={"content-type": "application/json"}
        ) as response:
            assert response.headers["x-digest"] == hashlib.sha256(request).hexdigest()
            received = hashlib.sha256()
            async for piece in response.content.iter_chunked(64 * 1024):
                received.update(piece)
                await asyncio.sleep(0)  # a client slower than the engine
        assert received.digest() == hashlib.sha256(big_response).digest()


# -- one request, one response: an engine cannot plant an answer --------------------------

PLANTED = b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nplanted"
"""What a hostile engine hopes the client takes as the answer to its next request."""


def sends_one_write(data: bytes) -> Script:
    async def script(conn: EngineConnection) -> None:
        while await conn.read_request() is not None:
            await conn.send(data)

    return script


def in_two_reads(first: bytes, second: bytes) -> Script:
    async def script(conn: EngineConnection) -> None:
        while await conn.read_request() is not None:
            await conn.send(first)
            await conn.until_read()  # the router read all of `first`: `second` is a later read
            await conn.send(second)

    return script


async def chat_then_models(port: int) -> tuple[int, bytes, int | None, bytes]:
    """A chat and then `GET /v1/models` on one keep-alive connection, raw.

    Returns the chat's status and body, then the second answer's status and body, or None
    if the router closed the connection after the chat.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(chat()).encode()
    try:
        writer.write(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
            % (CHAT.encode(), len(body), body)
        )
        status, answer = await read_raw_response(reader)
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        try:
            second_status, second = await read_raw_response(reader)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            return status, answer, None, b""
        return status, answer, second_status, second
    finally:
        writer.close()


async def read_raw_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    status = int(head.split(b" ", 2)[1])
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        body = b""
        while size := int(await asyncio.wait_for(reader.readuntil(b"\r\n"), TIMEOUT), 16):
            body += (await asyncio.wait_for(reader.readexactly(size + 2), TIMEOUT))[:-2]
        await asyncio.wait_for(reader.readexactly(2), TIMEOUT)
        return status, body
    length = int(lowered.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    return status, await asyncio.wait_for(reader.readexactly(length), TIMEOUT)


HOSTILE_ANSWERS = {
    "two responses in one write": (
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok" + PLANTED,
        502,
    ),
    "a 1xx with a content-length before a chunked 200": (
        b"HTTP/1.1 103 Early Hints\r\ncontent-length: %d\r\n\r\n" % len(PLANTED)
        + b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        200,
    ),
    "a status below 100 with a body ahead of the 200": (
        b"HTTP/1.1 099 X\r\ncontent-length: %d\r\n\r\n%s" % (len(PLANTED), PLANTED)
        + b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        502,
    ),
    "a status above 599": (b"HTTP/1.1 600 X\r\ncontent-length: 7\r\n\r\nplanted", 502),
    "a 101 nobody asked for": (
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\n" + PLANTED,
        502,
    ),
    "a response head over the limit": (
        b"HTTP/1.1 200 OK\r\nx-big: %s\r\ncontent-length: 2\r\n\r\nok"
        % (b"a" * (SETTINGS.max_header_size + 1)),
        502,
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_ANSWERS))
async def test_a_hostile_engine_gets_exactly_one_answer_to_the_client(case: str) -> None:
    answer, expected_status = HOSTILE_ANSWERS[case]
    script = sends_one_write(answer)
    async with raw_engine(script) as engine, routed(extra_urls=[engine.url]) as setup:
        status, body, second_status, second = await chat_then_models(setup.port)
        assert status == expected_status, body
        assert b"planted" not in body
        if expected_status == 200:
            assert body == b"ok"
        assert second_status == 200, "the client connection stays usable"
        assert json.loads(second)["path"] == "/v1/models", second  # the router's own answer
        status, _, _, _ = await chat_then_models(setup.port)
        assert status == expected_status
        assert engine.accepted == (1 if expected_status == 200 else 2), "reused after a violation"


async def test_a_status_below_100_then_the_200_in_a_later_read_sends_no_byte_early() -> None:
    first = b"HTTP/1.1 099 X\r\ncontent-length: %d\r\n\r\n%s" % (len(PLANTED), PLANTED)
    later = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    async with raw_engine(in_two_reads(first, later)) as engine:
        async with routed(extra_urls=[engine.url]) as setup:
            status, body, second_status, second = await chat_then_models(setup.port)
            assert status == 502 and b"protocol_violation" in body
            assert second_status == 200 and json.loads(second)["path"] == "/v1/models"


# -- headers --------------------------------------------------------------------------------


def echo_engine(seen: list[bytes]) -> Any:
    """A script answering with hop-by-hop headers of its own; records each request head."""

    async def script(conn: EngineConnection) -> None:
        while (request := await conn.read_request()) is not None:
            seen.append(request[0])
            await conn.send(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                b"connection: keep-alive, x-engine-hop\r\nx-engine-hop: 1\r\n"
                b"keep-alive: timeout=5\r\nproxy-foo: x\r\ntrailer: x-t\r\nupgrade: h2c\r\n"
                b"x-request-id: engine-made-this-up\r\nx-kept-response: yes\r\n\r\n{}"
            )

    return script


def header_names(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {
        line.partition(":")[0].strip().lower(): line.partition(":")[2].strip()
        for line in lines
        if line
    }


async def raw_call(port: int, request: bytes) -> tuple[bytes, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        length = int(header_names(head)["content-length"])
        return head, await asyncio.wait_for(reader.readexactly(length), TIMEOUT)
    finally:
        writer.close()


async def test_hop_by_hop_headers_are_dropped_both_ways() -> None:
    seen: list[bytes] = []
    async with raw_engine(echo_engine(seen)) as engine, routed(extra_urls=[engine.url]) as setup:
        body = json.dumps(chat()).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: router.example\r\n"
            b"Connection: keep-alive, X-Client-Hop\r\nX-Client-Hop: 1\r\nKeep-Alive: 300\r\n"
            b"Proxy-Authorization: Basic eA==\r\nTE: trailers\r\nX-Kept: yes\r\n"
            b"Authorization: Bearer token\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        head, _ = await raw_call(setup.port, request)
        upstream = header_names(seen[0])
        for dropped in ("connection", "x-client-hop", "keep-alive", "proxy-authorization", "te"):
            assert dropped not in upstream
        assert upstream["host"] == f"127.0.0.1:{engine.port}"
        assert upstream["content-length"] == str(len(body))
        assert upstream["x-kept"] == "yes" and upstream["authorization"] == "Bearer token"
        downstream = header_names(head)
        for dropped in ("x-engine-hop", "keep-alive", "proxy-foo", "trailer", "upgrade"):
            assert dropped not in downstream
        assert downstream["x-kept-response"] == "yes"
        assert "connection" not in downstream  # the client's connection stays keep-alive
        assert downstream["x-request-id"] == upstream["x-request-id"]  # ours, not the engine's


async def test_request_id_is_created_once_and_passed_both_ways() -> None:
    seen: list[bytes] = []
    async with raw_engine(echo_engine(seen)) as engine, routed(extra_urls=[engine.url]) as setup:
        made = [(await setup.post(CHAT, chat()))[2]["X-Request-ID"] for _ in range(2)]
        assert made[0] != made[1]
        assert [header_names(head)["x-request-id"] for head in seen] == made
        async with setup.session.post(
            setup.url + CHAT, json=chat(), headers={"x-request-id": "client-chose-this"}
        ) as response:
            assert response.headers["x-request-id"] == "client-chose-this"
        assert header_names(seen[-1])["x-request-id"] == "client-chose-this"


# -- errors answered by the router ----------------------------------------------------------


def assert_openai_error(body: dict[str, Any], code: str) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "code"}
    assert body["error"]["code"] == code
    assert "Traceback" not in body["error"]["message"]


async def test_invalid_requests_get_openai_shaped_400s() -> None:
    async with routed(sim("a")) as setup:
        cases: list[tuple[bytes, str]] = [
            (b"{not json", "invalid_json"),
            (b"\xff\xfe", "invalid_json"),
            (b'["a list"]', "invalid_request"),
            (b'{"messages": []}', "missing_model"),
            (b'{"model": 7}', "missing_model"),
        ]
        for raw, code in cases:
            async with setup.session.post(setup.url + CHAT, data=raw) as response:
                assert response.status == 400
                assert response.headers["x-request-id"]
                assert_openai_error(await response.json(), code)
        assert setup.loads() == [(0, 0, 0)]


async def test_unknown_model_gets_404_model_not_found() -> None:
    async with routed(sim("a")) as setup:
        status, body, _ = await setup.post(CHAT, chat(model="no-such-model"))
        assert status == 404
        assert_openai_error(body, "model_not_found")
        assert "no-such-model" in body["error"]["message"]
        assert (
            setup.sample("headcount_requests_total", model="unknown", code="404", outcome="ok") == 1
        )


async def test_body_over_max_body_size_gets_413() -> None:
    async with routed(sim("a")) as setup:
        status, body, _ = await setup.post(CHAT, chat(padding="x" * 100_000))
        assert status == 413
        assert_openai_error(body, "request_too_large")
        counted = setup.sample(
            "headcount_requests_total", model="unknown", code="413", outcome="ok"
        )
        assert counted == 1, "requests refused by the HTTP layer are counted too"


async def test_known_model_without_routable_engine_gets_503_naming_it() -> None:
    async with routed(sim("a"), sim("b")) as setup:
        for engine_id in setup.engine_ids:
            setup.fleet.eject(engine_id, "test")
        status, body, _ = await setup.post(CHAT, chat())
        assert status == 503
        assert_openai_error(body, "no_engine_available")
        assert MODEL in body["error"]["message"] and "unhealthy" in body["error"]["message"]


async def test_empty_fleet_gets_503_not_404() -> None:
    async with routed() as setup:
        status, body, _ = await setup.post(CHAT, chat())
        assert status == 503
        assert "empty" in body["error"]["message"]


# -- failover -------------------------------------------------------------------------------


async def test_refused_engine_is_failed_over_and_ejected() -> None:
    async with routed(sim("dead", fail_mode="refuse"), sim("alive")) as setup:
        for _ in range(6):
            status, _, headers = await setup.post(CHAT, chat())
            assert status == 200 and headers["x-engine-name"] == "alive"
        dead = setup.engine_ids[0]
        assert setup.fleet.snapshot.by_id[dead].state is EngineState.UNHEALTHY
        assert setup.sample("headcount_upstream_failovers_total", reason="connect_failed") >= 1
        assert setup.loads()[0][2] >= 1  # the dead engine's failures
        assert setup.loads()[1] == (0, 6, 0)
        assert setup.all_released()


async def test_503_from_an_engine_is_failed_over_without_ejecting_it() -> None:
    busy = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy"

    async def script(conn: EngineConnection) -> None:
        while await conn.read_request() is not None:
            await conn.send(busy)

    async with raw_engine(script) as engine, routed(sim("alive"), extra_urls=[engine.url]) as setup:
        for _ in range(4):
            status, _, headers = await setup.post(CHAT, chat())
            assert status == 200 and headers["x-engine-name"] == "alive"
        assert setup.sample("headcount_upstream_failovers_total", reason="http_503") >= 1
        assert setup.fleet.snapshot.by_id[engine.url].state is EngineState.READY
        assert setup.all_released()


async def test_503_is_passed_through_when_no_other_engine_is_left() -> None:
    busy = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy"

    async def script(conn: EngineConnection) -> None:
        while await conn.read_request() is not None:
            await conn.send(busy)

    async with raw_engine(script) as engine, routed(extra_urls=[engine.url]) as setup:
        async with setup.session.post(setup.url + CHAT, json=chat()) as response:
            assert (response.status, await response.read()) == (503, b"busy")
        assert setup.all_released()


async def test_a_500_is_tried_once_more_and_two_engines_500_is_the_answer() -> None:
    async with routed(sim("a", fail_mode="http-500"), sim("b", fail_mode="http-500")) as setup:
        for _ in range(4):
            status, body, _ = await setup.post(CHAT, chat())
            assert status == 500 and "simulated engine failure" in body["error"]["message"]
        assert [requests for _, requests, _ in setup.loads()] == [4, 4]  # each on both, once
        assert setup.sample("headcount_upstream_failovers_total", reason="http_5xx") == 4
        assert setup.fleet.snapshot.ejected == frozenset()


async def test_all_engines_refusing_gets_502() -> None:
    async with routed(sim("a", fail_mode="refuse"), sim("b", fail_mode="refuse")) as setup:
        status, body, _ = await setup.post(CHAT, chat())
        assert status == 502
        assert_openai_error(body, "upstream_failed")
        assert "2 engine(s)" in body["error"]["message"]
        assert all(e.state is EngineState.UNHEALTHY for e in setup.fleet.snapshot.engines)
        assert setup.all_released()


async def test_failover_stops_after_max_failovers() -> None:
    settings = ProxySettings(connect_timeout=1.0, read_timeout=5.0, max_failovers=2)
    configs = [sim(name, fail_mode="refuse") for name in "abcd"]
    async with routed(*configs, settings=settings) as setup:
        status, body, _ = await setup.post(CHAT, chat())
        assert status == 502 and "3 engine(s)" in body["error"]["message"]
        assert sum(requests for _, requests, _ in setup.loads()) == 3
        assert setup.sample("headcount_upstream_failovers_total", reason="connect_failed") == 2


async def test_connect_timeout_fails_over_then_504_when_nothing_is_left() -> None:
    settings = ProxySettings(connect_timeout=0.3, read_timeout=5.0)
    with blackholed_listener() as port:
        blackholed = f"http://127.0.0.1:{port}"
        async with routed(sim("alive"), extra_urls=[blackholed], settings=settings) as setup:
            for _ in range(2):
                status, _, headers = await setup.post(CHAT, chat())
                assert status == 200 and headers["x-engine-name"] == "alive"
            assert setup.fleet.snapshot.by_id[blackholed].state is EngineState.UNHEALTHY
            assert setup.sample("headcount_upstream_failovers_total", reason="connect_timeout") == 1
        async with routed(extra_urls=[blackholed], settings=settings) as setup:
            status, body, _ = await setup.post(CHAT, chat())
            assert status == 504
            assert_openai_error(body, "upstream_timeout")
            assert setup.all_released()


async def test_hanging_engine_gets_504_after_read_timeout() -> None:
    settings = ProxySettings(connect_timeout=1.0, read_timeout=0.3)
    async with routed(sim("a", fail_mode="hang"), settings=settings) as setup:
        loop = asyncio.get_running_loop()
        started = loop.time()
        status, body, _ = await setup.post(CHAT, chat())
        took = loop.time() - started
        assert status == 504
        assert_openai_error(body, "upstream_timeout")
        # Not before the read timeout (less a little for timer granularity), and not long after.
        assert settings.read_timeout * 0.9 <= took < 3.0, took
        await wait_until(setup.all_released, timeout=TIMEOUT)
        await wait_until(lambda: setup.engines[0].stats()["in_flight"] == 0, timeout=TIMEOUT)


async def test_with_resume_off_a_stream_dying_midway_breaks_without_retry() -> None:
    configs = (sim("a", fail_mode="die-mid-stream"), sim("b", fail_mode="die-mid-stream"))
    off = ProxySettings(connect_timeout=1.0, read_timeout=5.0, stream_resume_limit=0)
    async with routed(*configs, settings=off) as setup:
        async with setup.session.post(setup.url + CHAT, json=chat(stream=True)) as response:
            assert response.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
        await wait_until(setup.all_released, timeout=TIMEOUT)
        assert sorted(setup.loads()) == [(0, 0, 0), (0, 1, 1)]  # one engine, one attempt
        # The client saw 200, then the stream broke: counted as such, not as a 502.
        assert setup.sample("headcount_requests_total", model=MODEL, code="200", outcome="cut") == 1
        assert (
            setup.sample("headcount_requests_total", model=MODEL, code="502", outcome="error") == 0
        )


async def test_stale_pooled_connection_is_retried_on_a_fresh_one() -> None:
    async def one_answer_per_connection(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await conn.read_request()  # a second request on this connection: drop it unanswered
        conn.writer.transport.abort()

    async with raw_engine(one_answer_per_connection) as engine:
        async with routed(extra_urls=[engine.url]) as setup:
            for _ in range(4):
                assert (await setup.post(CHAT, chat()))[0] == 200
            assert engine.accepted >= 4
            assert setup.fleet.snapshot.by_id[engine.url].state is EngineState.READY
            assert setup.sample("headcount_upstream_failovers_total", reason="no_response") == 0
            assert setup.loads()[0][2] == 0  # a stale connection is not the engine's failure


async def test_engine_connections_are_kept_alive_across_requests() -> None:
    seen: list[bytes] = []
    async with raw_engine(echo_engine(seen)) as engine, routed(extra_urls=[engine.url]) as setup:
        for _ in range(5):
            assert (await setup.post(CHAT, chat()))[0] == 200
        assert len(seen) == 5 and engine.accepted == 1


async def test_pipelined_client_requests_are_answered_in_order() -> None:
    async with routed(sim("a", token_delay=0.01), sim("b")) as setup:
        reader, writer = await asyncio.open_connection("127.0.0.1", setup.port)
        requests = []
        for index, stream in enumerate((True, False, False)):
            body = json.dumps(chat(stream=stream, max_tokens=3, user=str(index))).encode()
            requests.append(
                b"POST %s HTTP/1.1\r\nhost: x\r\nx-request-id: req-%d\r\n"
                b"content-length: %d\r\n\r\n%s" % (CHAT.encode(), index, len(body), body)
            )
        writer.write(b"".join(requests))
        answered = []
        for _ in range(3):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
            headers = header_names(head)
            answered.append(headers["x-request-id"])
            if "content-length" in headers:
                await reader.readexactly(int(headers["content-length"]))
            else:
                await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), TIMEOUT)
        writer.close()
        assert answered == ["req-0", "req-1", "req-2"]


# -- client disconnects ---------------------------------------------------------------------


async def abort_after_first_chunk(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(chat(stream=True, max_tokens=2000)).encode()
    writer.write(
        b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
        % (CHAT.encode(), len(body), body)
    )
    await asyncio.wait_for(reader.readuntil(b"data: "), TIMEOUT)
    writer.transport.abort()


async def test_aborted_streams_release_every_counter() -> None:
    async with routed(sim("a", token_delay=0.01), sim("b", token_delay=0.01)) as setup:
        for _ in range(4):  # 200 streams, 50 at a time
            await asyncio.gather(*(abort_after_first_chunk(setup.port) for _ in range(50)))
        await wait_until(setup.all_released, timeout=TIMEOUT, what="router counters at 0")
        await wait_until(
            lambda: all(engine.stats()["in_flight"] == 0 for engine in setup.engines),
            timeout=RELEASE_TIMEOUT,
            what="engines' own in-flight at 0",
        )
        assert sum(requests for _, requests, _ in setup.loads()) == 200
        # Each client saw its 200 before leaving.
        left = setup.sample(
            "headcount_requests_total", model=MODEL, code="200", outcome="client_closed"
        )
        assert left == 200


async def test_client_leaving_while_the_engine_thinks_releases_the_engine() -> None:
    async with routed(sim("a", token_delay=0.5)) as setup:
        _, writer = await asyncio.open_connection("127.0.0.1", setup.port)
        body = json.dumps(chat(max_tokens=100)).encode()
        writer.write(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
            % (CHAT.encode(), len(body), body)
        )
        await wait_until(lambda: setup.engines[0].stats()["in_flight"] == 1, timeout=TIMEOUT)
        writer.close()
        await wait_until(setup.all_released, timeout=TIMEOUT)
        await wait_until(
            lambda: setup.engines[0].stats()["in_flight"] == 0, timeout=RELEASE_TIMEOUT
        )


# -- real clients ---------------------------------------------------------------------------


async def test_openai_sdk_streaming_and_not() -> None:
    from openai import AsyncOpenAI

    async with routed(sim("a"), sim("b")) as setup:
        client = AsyncOpenAI(
            base_url=setup.url + "/v1", api_key="x", timeout=TIMEOUT, max_retries=0
        )
        try:
            completion = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert completion.choices[0].message.content
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
            )
            pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
            assert len(pieces) == 4
            embedding = await client.embeddings.create(model=MODEL, input="hi")
            assert embedding.data[0].embedding
        finally:
            await client.close()
        assert setup.all_released()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
async def test_curl_streaming_and_not() -> None:
    async with routed(sim("a")) as setup:
        for stream in (False, True):
            body = json.dumps(chat(stream=stream, max_tokens=3))
            process = await asyncio.create_subprocess_exec(
                "curl",
                "-sS",
                "-N",
                "--max-time",
                str(TIMEOUT),
                "-H",
                "content-type: application/json",
                "-d",
                body,
                setup.url + CHAT,
                stdout=asyncio.subprocess.PIPE,
            )
            output, _ = await asyncio.wait_for(process.communicate(), TIMEOUT + 5)
            assert process.returncode == 0
            if stream:
                assert output.count(b"data: ") == 4 and output.endswith(b"data: [DONE]\n\n")
            else:
                assert json.loads(output)["object"] == "chat.completion"


# -- local requests, drain, fleet changes ---------------------------------------------------


async def test_other_requests_go_to_the_local_app() -> None:
    async with routed(sim("a")) as setup:
        async with setup.session.get(setup.url + "/v1/models?x=1") as response:
            assert response.status == 200 and response.headers["x-local"] == "yes"
            document = await response.json()
        assert (document["method"], document["path"], document["query"]) == (
            "GET",
            "/v1/models",
            "x=1",
        )
        async with setup.session.get(setup.url + CHAT) as response:  # GET is not proxied
            assert response.status == 405 and response.headers["allow"] == "POST"
        async with setup.session.get(setup.url + "/missing") as response:
            assert response.status == 404
        async with setup.session.head(setup.url + "/v1/models") as response:
            assert response.status == 200 and await response.read() == b""


async def test_local_app_failure_is_a_generic_500() -> None:
    async with routed(sim("a")) as setup:
        async with setup.session.get(setup.url + "/boom") as response:
            assert response.status == 500
            text = await response.text()
        assert "secret" not in text and "Traceback" not in text
        assert_openai_error(json.loads(text), "internal_error")
        assert setup.proxy.in_flight == 0


async def test_drain_lets_a_stream_finish_and_refuses_new_connections() -> None:
    async with routed(sim("a", token_delay=0.02)) as setup:
        async with setup.session.post(
            setup.url + CHAT, json=chat(stream=True, max_tokens=10)
        ) as response:
            await response.content.readuntil(b"\n\n")
            setup.proxy.begin_drain()
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", setup.port)
            assert not await setup.proxy.wait_idle(0.01)
            assert (await response.read()).endswith(b"data: [DONE]\n\n")
        assert await setup.proxy.wait_idle(TIMEOUT)


async def test_pools_of_engines_that_left_the_fleet_are_closed() -> None:
    async with routed(sim("a"), sim("b")) as setup:
        for _ in range(2):
            assert (await setup.post(CHAT, chat()))[0] == 200
        assert len(setup.proxy.upstreams) == 2
        gone = setup.fleet.snapshot.by_id[setup.engine_ids[0]]
        pool = setup.proxy.upstreams.pool(gone.id, gone.url)
        assert pool.idle == 1
        setup.fleet.reconcile("static", [setup.fleet.snapshot.by_id[setup.engine_ids[1]].spec])
        assert pool.idle == 0
        assert len(setup.proxy.upstreams) == 1
        assert (await setup.post(CHAT, chat()))[2]["x-engine-name"] == "b"


# -- on the production event loop -----------------------------------------------------------


@pytest.mark.parametrize(
    ("routing", "request_for"),
    [
        (RoutingName.SESSION, lambda i: ({"x-session-id": f"s{i % 8}"}, chat())),
        (
            RoutingName.PREFIX,
            lambda i: ({}, {"model": MODEL, "prompt": f"document {i % 8} " * 50}),
        ),
    ],
)
async def test_affinity_routing_keeps_each_key_on_one_engine(
    routing: RoutingName, request_for: Any
) -> None:
    configs = [EngineSimConfig(name=f"e{i}") for i in range(4)]
    policy = make_policy(routing, affinity_epsilon=SETTINGS.affinity_epsilon)
    async with routed(*configs, policy=policy) as setup:
        served: dict[int, set[str]] = {}
        for i in range(32):
            headers, body = request_for(i)
            path = CHAT if "messages" in body else "/v1/completions"
            async with setup.session.post(setup.url + path, json=body, headers=headers) as response:
                assert response.status == 200
                served.setdefault(i % 8, set()).add(response.headers["x-engine-name"])
        assert all(len(engines) == 1 for engines in served.values()), served
        assert len(set().union(*served.values())) > 1, "keys should not all share one engine"


# -- a request never waits on an engine known to be dead ----------------------------------

PATIENT = ProxySettings(connect_timeout=1.0, read_timeout=60.0)
"""A read timeout far beyond the client's: only failover can answer these requests in time."""


class Prefer:
    """Routes to `engine_id` whenever it is a candidate, else to the first candidate."""

    name = "prefer"
    key_source = None

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id

    def select(self, candidates: Sequence[Any], request: Any) -> Any:
        chosen = [engine for engine in candidates if engine.id == self.engine_id]
        return (chosen or list(candidates) or [None])[0]


def leave_rotation(setup: Routed, engine_id: str, how: str) -> None:
    fleet = setup.fleet
    if how == "ejected":
        fleet.eject(engine_id, "connect refused by the engine")
    elif how == "probes fail":
        for _ in range(ProbeSettings().unhealthy_after):
            fleet.apply_probe(engine_id, ProbeResult(ok=False, error="HTTP 500"))
    elif how == "outlier":
        for _ in range(OutlierSettings().consecutive_errors):
            fleet.record_error(engine_id, "gateway_error")
    elif how == "removed":
        fleet.reconcile("static", [e.spec for e in fleet.snapshot.engines if e.id != engine_id])
    else:
        raise AssertionError(how)


async def waiting_on(setup: Routed, silent: Silent, requests: int = 1) -> None:
    await wait_until(
        lambda: silent.requests == requests and setup.proxy.awaiting_first_byte == 1,
        what="the request waiting on the silent engine",
    )


@pytest.mark.parametrize("how", ["ejected", "probes fail", "outlier", "removed"])
async def test_a_request_waiting_on_an_engine_that_leaves_rotation_fails_over_at_once(
    how: str,
) -> None:
    silent = Silent()
    async with raw_engine(silent) as engine:
        async with routed(
            sim("alive"), extra_urls=[engine.url], settings=PATIENT, policy=Prefer(engine.url)
        ) as setup:
            request = asyncio.ensure_future(setup.post(CHAT, chat()))
            await waiting_on(setup, silent)
            leave_rotation(setup, engine.url, how)
            status, _, headers = await request  # the client gives up long before read_timeout
            assert (status, headers["x-engine-name"]) == (200, "alive")
            reason = "engine_removed" if how == "removed" else "engine_left_rotation"
            assert setup.sample("headcount_upstream_failovers_total", reason=reason) == 1
            if how == "removed":
                setup.engine_ids.remove(engine.url)
            else:
                assert setup.loads()[1][2] == 0, "leaving is not counted as the engine's failure"
            await wait_until(setup.all_released)


@pytest.mark.parametrize(
    ("alive", "status", "code"),
    [(False, 503, "no_engine_available"), (True, 502, "upstream_failed")],
)
async def test_with_no_engine_to_fail_over_to_the_answer_comes_at_once(
    alive: bool, status: int, code: str
) -> None:
    silent = Silent()
    settings = ProxySettings(connect_timeout=1.0, read_timeout=60.0, max_failovers=0)
    configs = (sim("alive"),) if alive else ()
    async with raw_engine(silent) as engine:
        async with routed(
            *configs, extra_urls=[engine.url], settings=settings, policy=Prefer(engine.url)
        ) as setup:
            request = asyncio.ensure_future(setup.post(CHAT, chat()))
            await waiting_on(setup, silent)
            setup.fleet.eject(engine.url, "connect refused by the engine")
            answered, body, _ = await request
            assert answered == status
            assert_openai_error(body, code)
            await wait_until(setup.all_released)


async def test_an_ejected_engine_still_routed_to_in_a_panic_is_still_waited_for() -> None:
    silent = Silent(answer=b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
    async with raw_engine(silent) as engine:
        async with routed(extra_urls=[engine.url], settings=PATIENT) as setup:
            request = asyncio.ensure_future(setup.post(CHAT, chat()))
            await waiting_on(setup, silent)
            leave_rotation(setup, engine.url, "outlier")  # 1 of 1 ejected: panic, route to all
            assert setup.fleet.snapshot.panicking == {MODEL}
            assert setup.proxy.awaiting_first_byte == 1, "not abandoned: it is the only one"
            silent.release.set()
            assert (await request)[0] == 200
            await wait_until(setup.all_released)


async def test_no_first_byte_within_first_byte_timeout_fails_over_then_504() -> None:
    settings = ProxySettings(connect_timeout=1.0, read_timeout=60.0, first_byte_timeout=0.2)
    silent = Silent()
    async with raw_engine(silent) as engine:
        async with routed(
            sim("alive"), extra_urls=[engine.url], settings=settings, policy=Prefer(engine.url)
        ) as setup:
            status, _, headers = await setup.post(CHAT, chat())
            assert (status, headers["x-engine-name"]) == (200, "alive")
            assert setup.sample("headcount_upstream_failovers_total", reason="first_byte_timeout")
            assert setup.loads()[1][2] == 1, "a silent engine is counted as failing"
            assert setup.fleet.snapshot.by_id[engine.url].load.consecutive_errors == 1
            await wait_until(setup.all_released)
        async with routed(extra_urls=[engine.url], settings=settings) as setup:
            status, body, _ = await setup.post(CHAT, chat())
            assert status == 504
            assert_openai_error(body, "upstream_timeout")
            await wait_until(setup.all_released)


async def test_first_byte_timeout_never_cuts_an_answer_that_has_begun() -> None:
    settings = ProxySettings(connect_timeout=1.0, read_timeout=5.0, first_byte_timeout=0.1)
    async with routed(sim("a", token_delay=0.15), settings=settings) as setup:
        async with setup.session.post(
            setup.url + CHAT, json=chat(stream=True, max_tokens=3)
        ) as response:
            assert response.status == 200
            assert setup.proxy.awaiting_first_byte == 0, "the head ended the wait"
            assert (await response.read()).endswith(b"data: [DONE]\n\n")
        assert setup.sample("headcount_upstream_failovers_total", reason="first_byte_timeout") == 0
        await wait_until(setup.all_released)


# -- outlier detection through the proxy ----------------------------------------------------


async def test_an_engine_answering_every_request_with_500_leaves_rotation() -> None:
    threshold = OutlierSettings().consecutive_errors
    async with routed(sim("broken", fail_mode="http-500"), sim("good")) as setup:
        answered = [(await setup.post(CHAT, chat()))[2] for _ in range(4 * threshold)]
        assert {headers["x-engine-name"] for headers in answered} == {"good"}  # tried again
        broken = setup.fleet.snapshot.by_id[setup.engine_ids[0]]
        assert broken.id in setup.fleet.snapshot.ejected and broken.state is EngineState.READY
        assert broken.load.requests == threshold, "out of rotation once its 500s were counted"
        assert setup.sample("headcount_outlier_ejections_total", reason="http_5xx") == 1
        assert setup.sample("headcount_outlier_ejections_total", reason="gateway_error") == 0
        await wait_until(setup.all_released)


def poisoned(answers: list[str]) -> Script:
    """A raw engine that answers a body holding `poison` with vLLM's JSON 500 (as vLLM answers
    some inputs it cannot handle) and any other with a chat completion; `answers` logs which."""
    error = b'{"error": {"message": "bad input", "type": "InternalServerError", "code": 500}}'
    fine = b'{"object": "chat.completion", "choices": []}'

    async def script(conn: EngineConnection) -> None:
        while (got := await conn.read_request()) is not None:
            bad = b"poison" in got[1]
            answers.append("500" if bad else "200")
            status, body = (b"500 Internal Server Error", error) if bad else (b"200 OK", fine)
            await conn.send(
                b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (status, len(body), body)
            )

    return script


async def test_a_lone_surrogate_is_a_400_that_no_engine_sees() -> None:
    """Issue 17 finding 9: `"\\ud800"` (valid JSON) got a 500 from the router."""
    answers: list[str] = []
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}]}'
    async with raw_engine(poisoned(answers)) as engine, routed(extra_urls=[engine.url]) as setup:
        for model in (MODEL.encode(), b"no-such-model"):
            async with setup.session.post(
                setup.url + CHAT, data=body % model, headers={"content-type": "application/json"}
            ) as response:
                assert response.status == 400
                assert_openai_error(await response.json(), "invalid_unicode")
    assert answers == []


async def test_requests_that_500_on_two_engines_eject_neither() -> None:
    """Issue 17 finding 9: five poisoned requests pinned by `x-session-id` ejected a healthy
    engine. A 5xx that a second engine answers with a 5xx too is the request's fault."""
    threshold = OutlierSettings().consecutive_errors
    first: list[str] = []
    second: list[str] = []
    policy = make_policy(RoutingName.SESSION, affinity_epsilon=1.0)
    async with raw_engine(poisoned(first)) as a, raw_engine(poisoned(second)) as b:
        async with routed(extra_urls=[a.url, b.url], policy=policy) as setup:
            pinned = {"x-session-id": "s-1"}
            poison = chat(messages=[{"role": "user", "content": "poison"}])
            for _ in range(3 * threshold):
                async with setup.session.post(
                    setup.url + CHAT, json=poison, headers=pinned
                ) as response:
                    assert response.status == 500
                    assert (await response.json())["error"]["message"] == "bad input"
            assert setup.fleet.snapshot.ejected == frozenset()
            assert len(first) == len(second) == 3 * threshold, "each tried on both, once"
            assert [engine.load.consecutive_errors for engine in setup.fleet.snapshot.engines] == [
                0,
                0,
            ]
            for _ in range(2):
                status, _, _ = await setup.post(CHAT, chat())
                assert status == 200
            await wait_until(setup.all_released)


async def test_protocol_violations_count_as_gateway_errors() -> None:
    outliers = OutlierSettings(consecutive_errors=2)
    script = sends_one_write(b"HTTP/1.1 600 X\r\ncontent-length: 2\r\n\r\nno")
    async with raw_engine(script) as engine:
        async with routed(sim("good"), extra_urls=[engine.url], outliers=outliers) as setup:
            statuses = [(await setup.post(CHAT, chat()))[0] for _ in range(8)]
            assert statuses.count(502) == 2, statuses
            assert setup.sample("headcount_outlier_ejections_total", reason="gateway_error") == 1
            assert engine.url in setup.fleet.snapshot.ejected


async def test_streams_that_break_midway_count_against_the_engine_though_resumed() -> None:
    outliers = OutlierSettings(consecutive_errors=2)
    configs = (sim("breaking", fail_mode="die-mid-stream"), sim("good"))
    prefer = Prefer("")
    async with routed(*configs, outliers=outliers, policy=prefer) as setup:
        breaking = prefer.engine_id = setup.engine_ids[0]
        for _ in range(2):
            async with setup.session.post(setup.url + CHAT, json=chat(stream=True)) as response:
                assert (response.status, response.headers["x-engine-name"]) == (200, "breaking")
                assert (await response.read()).endswith(b"data: [DONE]\n\n")  # resumed
        assert setup.fleet.snapshot.ejected == {breaking}
        assert setup.sample("headcount_outlier_ejections_total", reason="gateway_error") == 1
        status, _, headers = await setup.post(CHAT, chat())
        assert (status, headers["x-engine-name"]) == (200, "good")
        await wait_until(setup.all_released)


async def test_any_answer_but_a_5xx_resets_the_count() -> None:
    threshold = OutlierSettings().consecutive_errors
    pattern = [500] * (threshold - 1) + [404]

    async def script(conn: EngineConnection) -> None:
        while await conn.read_request() is not None:
            status = pattern[script.answered % len(pattern)]  # type: ignore[attr-defined]
            script.answered += 1  # type: ignore[attr-defined]
            await conn.send(b"HTTP/1.1 %d X\r\ncontent-length: 2\r\n\r\n{}" % status)

    script.answered = 0  # type: ignore[attr-defined]
    async with raw_engine(script) as engine, routed(extra_urls=[engine.url]) as setup:
        statuses = [(await setup.post(CHAT, chat()))[0] for _ in range(3 * len(pattern))]
        assert statuses == pattern * 3
        assert setup.fleet.snapshot.ejected == frozenset()


# -- the router's own failures are no engine's ----------------------------------------------


def failing_dial(error_number: int) -> Dial:
    async def dial(factory: Any, address: str, port: int) -> Any:
        raise OSError(error_number, os.strerror(error_number))

    return dial


@pytest.mark.parametrize(
    ("error_number", "resource"),
    [
        (errno.EMFILE, "fds"),
        (errno.ENFILE, "fds"),
        (errno.ENOMEM, "memory"),
        (errno.ENOBUFS, "buffers"),
    ],
)
async def test_running_out_of_its_own_resources_is_a_503_and_no_engine_is_blamed(
    error_number: int, resource: str
) -> None:
    async with routed(sim("a"), sim("b"), dial=failing_dial(error_number)) as setup:
        for _ in range(2 * OutlierSettings().consecutive_errors):
            status, body, _ = await setup.post(CHAT, chat())
            assert status == 503
            assert_openai_error(body, "overloaded")
        assert all(engine.routable for engine in setup.fleet.snapshot.engines)
        assert setup.fleet.snapshot.ejected == frozenset()
        assert [failures for _, _, failures in setup.loads()] == [0, 0]
        assert setup.sample("headcount_local_resource_errors_total", resource=resource) == 10
        assert setup.sample("headcount_upstream_failovers_total", reason="connect_failed") == 0
        assert setup.all_released()
