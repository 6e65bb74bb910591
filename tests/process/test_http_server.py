"""The client-facing HTTP/1.1 server, as clients use it: raw sockets, byte-split input, order.

Most tests speak raw HTTP to a real server on 127.0.0.1 through
`asyncio.open_connection`; the byte-split tests feed a connection's protocol one
byte (or one random piece) at a time (TCP would coalesce such writes) through a
minimal transport. The handler here echoes what it received, answers `/slow`
late, streams `/stream` in parts, sends `/big` large and `/flood` until the
client stops reading, so each test reads as a client's conversation. Hostile
clients (memory, deadlines, back-pressure, limits) are here too, next to the
helpers they share, hence the length.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import json
import socket
import tracemalloc
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headcount._http.connections import ConnectionRegistry
from headcount._http.handler import HeadScreen
from headcount._http.server import HttpServerProtocol, ServerLimits
from headcount.compiled import data_plane
from tests.support import wait_until
from tests.support.http_server import LIMITS, EchoApp, RecordingTransport, refusing

TIMEOUT = 5.0


class Server:
    def __init__(self, server: asyncio.Server, app: EchoApp, registry: ConnectionRegistry) -> None:
        self.server = server
        self.app = app
        self.registry = registry
        self.port: int = server.sockets[0].getsockname()[1]
        self.protocols: list[weakref.ref[HttpServerProtocol]] = []

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), TIMEOUT)


async def start(
    limits: ServerLimits = LIMITS,
    registry: ConnectionRegistry | None = None,
    send_buffer: int | None = None,
    screen: HeadScreen | None = None,
) -> Server:
    """A server on 127.0.0.1; `send_buffer` shrinks each connection's kernel send buffer (set
    on the listening socket, whose accepted sockets inherit it), `screen` sees each head
    before its body is read."""
    loop = asyncio.get_running_loop()
    app = EchoApp()
    registry = registry if registry is not None else ConnectionRegistry()
    protocols: list[weakref.ref[HttpServerProtocol]] = []

    def factory() -> HttpServerProtocol:
        protocol = HttpServerProtocol(app, limits, registry, loop, screen=screen)
        protocols.append(weakref.ref(protocol))
        return protocol

    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if send_buffer is not None:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    listening.bind(("127.0.0.1", 0))
    server = await loop.create_server(factory, sock=listening)
    running = Server(server, app, registry)
    running.protocols = protocols
    return running


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    running = await start()
    yield running
    running.registry.close()
    running.server.close()


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


async def read_response(reader: asyncio.StreamReader, head_request: bool = False) -> Response:
    """One response: by content-length, chunked, or until the connection closes."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    status = int(status_line.split()[1])
    if head_request or status in (100, 204, 304):
        return Response(status, headers, b"")
    if "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), TIMEOUT)
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int(await asyncio.wait_for(reader.readuntil(b"\r\n"), TIMEOUT), 16)
            chunk = await asyncio.wait_for(reader.readexactly(size + 2), TIMEOUT)
            body += chunk[:-2]
            if size == 0:
                break
    else:
        body = await asyncio.wait_for(reader.read(), TIMEOUT)
    return Response(status, headers, body)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), TIMEOUT) == b""
    except ConnectionResetError:
        return True


def get(path: str = "/", *headers: str, version: str = "1.1") -> bytes:
    lines = [f"GET {path} HTTP/{version}", "Host: test", *headers, "", ""]
    return "\r\n".join(lines).encode()


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}", *headers]
    return "\r\n".join([*lines, "", ""]).encode() + body


# -- keep-alive and connection management ---------------------------------------------------


async def test_keep_alive_serves_several_requests_on_one_connection(server: Server) -> None:
    reader, writer = await server.connect()
    for n in range(3):
        writer.write(get(f"/n{n}?q={n}"))
        response = await read_response(reader)
        assert response.status == 200
        assert response.json()["path"] == f"/n{n}"
        assert response.json()["query"] == f"q={n}"
        assert "connection" not in response.headers
    writer.close()


async def test_a_request_knows_the_address_its_connection_comes_from(server: Server) -> None:
    for address in ("127.0.0.1", "127.0.0.2"):
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", server.port, local_addr=(address, 0)), TIMEOUT
        )
        writer.write(get("/echo"))
        assert (await read_response(reader)).json()["client"] == address
        writer.close()


async def test_client_sockets_have_nodelay(server: Server) -> None:
    # Nagle's algorithm plus the client's delayed ACK holds a small write behind an
    # unacknowledged one for ~40 ms on a reused connection: every streamed chunk would wait.
    reader, writer = await server.connect()
    writer.write(get("/nodelay"))
    assert (await read_response(reader)).body == b"1"
    writer.close()


async def test_connection_close_is_answered_then_closed(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(get("/", "Connection: close"))
    response = await read_response(reader)
    assert response.status == 200
    assert response.headers["connection"] == "close"
    assert await closed_by_server(reader)
    writer.close()


async def test_http10_closes_by_default(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(get("/", version="1.0"))
    response = await read_response(reader)
    assert response.status == 200
    assert response.headers["connection"] == "close"
    assert await closed_by_server(reader)
    writer.close()


async def test_http10_keeps_alive_when_asked(server: Server) -> None:
    reader, writer = await server.connect()
    for _ in range(2):
        writer.write(get("/", "Connection: keep-alive", version="1.0"))
        response = await read_response(reader)
        assert response.status == 200
        assert response.headers["connection"] == "keep-alive"
    writer.close()


async def test_http10_stream_is_delimited_by_close(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(get("/stream", "Connection: keep-alive", version="1.0"))
    response = await read_response(reader)
    assert "transfer-encoding" not in response.headers
    assert response.headers["connection"] == "close"
    assert response.body == b"one,two,three"
    writer.close()


async def test_stream_is_chunked_for_http11_and_keeps_the_connection(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(get("/stream"))
    response = await read_response(reader)
    assert response.headers["transfer-encoding"] == "chunked"
    assert response.body == b"one,two,three"
    writer.write(get("/after"))
    assert (await read_response(reader)).json()["path"] == "/after"
    writer.close()


async def test_idle_connection_closes_after_keepalive_timeout() -> None:
    running = await start(dataclasses.replace(LIMITS, keepalive_timeout=0.2))
    try:
        reader, writer = await running.connect()
        writer.write(get("/"))
        assert (await read_response(reader)).status == 200
        assert await closed_by_server(reader)  # within TIMEOUT, after ~0.2 s of silence
        writer.close()
    finally:
        running.server.close()


async def test_head_gets_headers_without_body(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(b"HEAD /x HTTP/1.1\r\nHost: test\r\n\r\n")
    response = await read_response(reader, head_request=True)
    assert response.status == 200
    assert int(response.headers["content-length"]) > 0
    writer.write(get("/next"))  # had a body leaked, this response would be misread
    assert (await read_response(reader)).json()["path"] == "/next"
    writer.close()


# -- request bodies -------------------------------------------------------------------------


async def test_content_length_body_reaches_the_handler(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(post("/echo", b'{"a": 1}'))
    assert (await read_response(reader)).json()["body"] == '{"a": 1}'
    writer.close()


async def test_chunked_body_reaches_the_handler_whole(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\n\r\n"
    )
    assert (await read_response(reader)).json()["body"] == "hello world"
    writer.close()


async def test_expect_100_continue_is_answered_before_the_body(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hello")
    assert (await read_response(reader)).json()["body"] == "hello"
    writer.close()


async def test_expect_100_continue_with_too_large_body_gets_413_without_sending_it(
    server: Server,
) -> None:
    reader, writer = await server.connect()
    writer.write(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
    )
    response = await read_response(reader)
    assert response.status == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert await closed_by_server(reader)
    writer.close()


async def test_unknown_expectation_gets_417(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nExpect: magic\r\n\r\nx")
    assert (await read_response(reader)).status == 417
    writer.close()


# -- requests answered from their head ------------------------------------------------------


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.mark.parametrize(
    "framing",
    [b"Content-Length: %d\r\n" % (len(SMUGGLED) + 500), b"Transfer-Encoding: chunked\r\n"],
    ids=["content-length", "chunked"],
)
async def test_a_request_answered_from_its_head_holds_none_of_its_body_and_never_parses_it(
    framing: bytes,
) -> None:
    registry = ConnectionRegistry(body_budget=1500)
    running = await start(registry=registry, screen=refusing)
    try:
        reader, writer = await running.connect()
        head = b"POST /refused HTTP/1.1\r\nHost: t\r\n%s\r\n" % framing
        writer.write(head + SMUGGLED + b"x" * 500)  # the body reads as a request of its own
        response = await read_response(reader)
        assert (response.status, response.headers["connection"]) == (401, "close")
        assert await closed_by_server(reader)  # and nothing for `/smuggled`
        assert running.app.dispatched == 0
        assert registry.bodies.held == 0
        writer.close()
    finally:
        running.server.close()


async def test_a_request_answered_from_its_head_gets_no_100_continue_and_no_413() -> None:
    running = await start(screen=refusing)
    try:
        reader, writer = await running.connect()
        writer.write(
            b"POST /refused HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        assert (await read_response(reader)).status == 401
        assert await closed_by_server(reader)
        writer.close()
    finally:
        running.server.close()


async def test_a_request_with_no_body_answered_from_its_head_keeps_the_connection() -> None:
    running = await start(screen=refusing)
    try:
        reader, writer = await running.connect()
        writer.write(get("/refused") + post("/echo", b"kept") + get("/refused"))
        statuses = [(await read_response(reader)).status for _ in range(3)]
        assert statuses == [401, 200, 401]
        writer.write(get("/echo"))
        assert (await read_response(reader)).json()["path"] == "/echo"
        writer.close()
    finally:
        running.server.close()


async def test_requests_before_one_answered_from_its_head_are_answered_in_order() -> None:
    running = await start(screen=refusing)
    try:
        reader, writer = await running.connect()
        refused = b"POST /refused HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\n"
        writer.write(post("/slow", b"first") + refused + b"123456789" + get("/never"))
        first = await read_response(reader)
        assert (first.status, first.json()["body"]) == (200, "first")
        assert (await read_response(reader)).status == 401
        assert await closed_by_server(reader)
        assert running.app.dispatched == 1
        writer.close()
    finally:
        running.server.close()


# -- limits and malformed input -------------------------------------------------------------


async def test_oversized_headers_get_431(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(get("/", "X-Big: " + "a" * 5000))
    response = await read_response(reader)
    assert response.status == 431
    assert set(response.json()["error"]) == {"message", "type", "code"}
    assert await closed_by_server(reader)
    writer.close()


async def test_many_header_fields_get_431(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(get("/", *(f"X-H{i}: {'v' * 40}" for i in range(200))))
    assert (await read_response(reader)).status == 431
    writer.close()


async def test_header_value_that_never_ends_gets_431(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(b"GET / HTTP/1.1\r\nX-Endless: ")
    for _ in range(20):
        writer.write(b"a" * 1000)
    response = await read_response(reader)
    assert response.status == 431
    writer.close()


async def test_body_over_limit_by_content_length_gets_413_before_reading(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n")  # no body sent
    response = await read_response(reader)
    assert response.status == 413
    writer.close()


async def test_chunked_body_over_limit_gets_413_while_reading(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(3):
        writer.write(b"190\r\n" + b"x" * 400 + b"\r\n")  # 1200 bytes, no terminating chunk
    response = await read_response(reader)
    assert response.status == 413
    assert await closed_by_server(reader)
    writer.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["no-request-line", "header-without-colon", "bad-content-length", "bad-chunk-size"],
)
async def test_malformed_request_gets_400_then_close(server: Server, raw: bytes) -> None:
    reader, writer = await server.connect()
    writer.write(raw)
    response = await read_response(reader)
    assert response.status == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert await closed_by_server(reader)
    writer.close()


# -- pipelining -----------------------------------------------------------------------------


async def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(get("/slow") + get("/fast") + post("/echo", b"third"))
    paths = [(await read_response(reader)).json()["path"] for _ in range(3)]
    assert paths == ["/slow", "/fast", "/echo"]
    writer.close()


async def test_error_after_pipelined_request_comes_after_its_answer(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(get("/slow") + b"BROKEN\r\n\r\n")
    first = await read_response(reader)
    second = await read_response(reader)
    assert (first.status, first.json()["path"]) == (200, "/slow")
    assert second.status == 400
    writer.close()


async def test_deep_pipeline_is_answered_whole(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(b"".join(get(f"/p{n}") for n in range(100)))
    paths = [(await read_response(reader)).json()["path"] for _ in range(100)]
    assert paths == [f"/p{n}" for n in range(100)]
    writer.close()


# -- disconnects and draining ---------------------------------------------------------------


async def test_client_disconnect_mid_exchange_is_reported_and_released(server: Server) -> None:
    _reader, writer = await server.connect()
    writer.write(get("/hang"))
    await wait_for(lambda: server.app.listeners and server.registry.active == 1)
    writer.close()
    await wait_for(lambda: server.app.listeners[0].lost)
    assert server.registry.active == 0


async def test_drain_closes_idle_connections_and_lets_busy_ones_finish(server: Server) -> None:
    idle_reader, idle_writer = await server.connect()
    idle_writer.write(get("/"))
    await read_response(idle_reader)
    busy_reader, busy_writer = await server.connect()
    busy_writer.write(get("/slow"))
    await wait_for(lambda: server.registry.active == 1)
    server.registry.drain()
    assert await closed_by_server(idle_reader)
    response = await read_response(busy_reader)
    assert response.status == 200
    assert response.headers["connection"] == "close"
    assert await server.registry.wait_idle(TIMEOUT)
    idle_writer.close()
    busy_writer.close()


async def test_a_connection_that_arrives_during_the_drain_is_answered_then_closed(
    server: Server,
) -> None:
    # Accepted just before the listener closed, it must not stay open as a keep-alive.
    server.registry.drain()
    reader, writer = await server.connect()
    writer.write(get("/late"))
    response = await read_response(reader)
    assert (response.status, response.headers["connection"]) == (200, "close")
    assert await closed_by_server(reader)
    writer.close()


async def wait_for(condition: Callable[[], object]) -> None:
    await wait_until(condition, timeout=TIMEOUT)


# -- byte-split input -----------------------------------------------------------------------


async def feed_bytewise(data: bytes, limits: ServerLimits = LIMITS) -> bytes:
    """Feed `data` one byte per read to a fresh connection; return what it wrote back."""
    return await feed_pieces([data[index : index + 1] for index in range(len(data))], limits)


async def feed_pieces(pieces: Sequence[bytes], limits: ServerLimits = LIMITS) -> bytes:
    """Feed each of `pieces` as one read to a fresh connection; return what it wrote back."""
    loop = asyncio.get_running_loop()
    transport = RecordingTransport()
    protocol = HttpServerProtocol(EchoApp(), limits, ConnectionRegistry(), loop)
    protocol.connection_made(transport)
    for piece in pieces:
        protocol.data_received(piece)
        await wait_for(lambda: protocol._backlog is None)  # a large read is parsed in slices
    protocol.connection_lost(None)
    return bytes(transport.written)


def split_responses(raw: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each content-length-framed response in `raw`."""
    responses = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        responses.append((int(lines[0].split()[1]), rest[:length]))
        raw = rest[length:]
    return responses


async def test_requests_fed_one_byte_at_a_time_are_parsed_whole() -> None:
    chunked = (
        b"POST /chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n"
    )
    raw = get("/first?a=b", "X-Split: value one") + post("/second", b'{"k": "v"}') + chunked
    responses = split_responses(await feed_bytewise(raw))
    documents = [json.loads(body) for _, body in responses]
    assert [d["path"] for d in documents] == ["/first", "/second", "/chunked"]
    assert documents[0]["query"] == "a=b"
    assert documents[0]["headers"]["x-split"] == "value one"
    assert documents[1]["body"] == '{"k": "v"}'
    assert documents[2]["body"] == "wikipedia"


async def test_oversized_header_fed_bytewise_gets_431() -> None:
    written = await feed_bytewise(get("/", "X-Big: " + "b" * 5000))
    assert split_responses(written)[0][0] == 431


async def test_error_fed_bytewise_ends_parsing() -> None:
    written = await feed_bytewise(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n" + get("/never"))
    assert [status for status, _ in split_responses(written)] == [400]


# -- memory: one buffer per body, a shared budget, nothing left behind -----------------------


def chunked(body: bytes, size: int) -> bytes:
    """`body` as a chunked request body in chunks of `size` bytes, terminator included."""
    pieces = (body[i : i + size] for i in range(0, len(body), size))
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


async def test_a_pipelining_client_gets_16_answers_per_loop_iteration_and_all_in_order() -> None:
    # 4 clients pipelining GETs the router answers itself once held the loop 36 ms: every
    # request parsed from a read was answered before anything else could run.
    app = EchoApp()
    transport = RecordingTransport()
    protocol = HttpServerProtocol(app, LIMITS, ConnectionRegistry(), asyncio.get_running_loop())
    protocol.connection_made(transport)
    protocol.data_received(
        b"".join(b"GET /echo?%d HTTP/1.1\r\nHost: t\r\n\r\n" % i for i in range(40))
    )
    assert app.dispatched == 16
    await wait_for(lambda: app.dispatched == 40)
    answers = [json.loads(body) for _, body in split_responses(bytes(transport.written))]
    assert [answer["query"] for answer in answers] == [str(i) for i in range(40)]
    protocol.connection_lost(None)


class SliceRecorder(HttpServerProtocol):
    """Records the size of every piece of input parsed at once."""

    def __init__(self, app: EchoApp, limits: ServerLimits) -> None:
        super().__init__(app, limits, ConnectionRegistry(), asyncio.get_running_loop())
        self.fed: list[int] = []

    def _feed(self, data: bytes | memoryview) -> None:
        self.fed.append(len(data))
        super()._feed(data)


@pytest.mark.skipif(
    data_plane() == "compiled", reason="subclasses the protocol: runs on the Python sources"
)
async def test_a_pipelining_connection_is_parsed_2_kib_at_a_time() -> None:
    # 16 KiB of pipelined GETs is ~470 requests parsed in one go: 4 such clients held the
    # loop 24 ms. A large body on a connection that does not pipeline keeps 16 KiB slices.
    app = EchoApp()
    pipelining = SliceRecorder(app, LIMITS)
    pipelining.connection_made(RecordingTransport())
    pipelining.data_received(b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n" * 1000)
    await wait_for(lambda: app.dispatched == 1000)
    assert pipelining.fed[0] == 16 * 1024
    assert max(pipelining.fed[1:]) == 2 * 1024
    pipelining.connection_lost(None)
    uploading = SliceRecorder(EchoApp(), dataclasses.replace(LIMITS, max_body_size=1 << 20))
    uploading.connection_made(RecordingTransport())
    uploading.data_received(post("/echo", b"x" * 64 * 1024))
    await wait_for(lambda: sum(uploading.fed) > 64 * 1024)
    assert max(uploading.fed) == 16 * 1024 and min(uploading.fed[:-1]) == 16 * 1024
    uploading.connection_lost(None)


async def test_a_refused_uploader_is_read_no_further_than_a_mebibyte() -> None:
    # An upload refused at its head (413 here) used to be read and dropped whole while the
    # router lingered: 25 uploaders refused at once had it read 775 MiB.
    class PausableTransport(RecordingTransport):
        paused = False

        def pause_reading(self) -> None:
            self.paused = True

    transport = PausableTransport()
    protocol = HttpServerProtocol(
        EchoApp(), LIMITS, ConnectionRegistry(), asyncio.get_running_loop()
    )
    protocol.connection_made(transport)
    protocol.data_received(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999\r\n\r\n")
    assert b" 413 " in transport.written
    for _ in range(15):  # 960 KiB
        protocol.data_received(b"x" * 65536)
    assert not transport.paused
    protocol.data_received(b"x" * 131072)
    assert transport.paused
    protocol.connection_lost(None)


async def test_a_body_sent_in_small_chunks_is_not_held_as_one_object_per_chunk() -> None:
    # 31 MiB sent as 2-byte chunks once grew the router to 925 MiB: ~56 bytes of objects per
    # 2 bytes of body. What a half-received body holds must stay close to its size, at the
    # smallest mean chunk size the server takes (64 bytes).
    limits = dataclasses.replace(LIMITS, max_body_size=1 << 20)
    loop = asyncio.get_running_loop()
    transport = RecordingTransport()
    protocol = HttpServerProtocol(EchoApp(), limits, ConnectionRegistry(), loop)
    protocol.connection_made(transport)
    protocol.data_received(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    size, chunk = 512_000, b"40\r\n" + b"a" * 64 + b"\r\n"
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(size // 64):
            protocol.data_received(chunk)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2 * size, f"{held} bytes held for a {size}-byte body"
    assert not transport.closed
    protocol.connection_lost(None)


async def test_a_body_of_over_256_tiny_chunks_gets_400_and_the_connection_closes() -> None:
    running = await start(dataclasses.replace(LIMITS, max_body_size=1 << 20))
    try:
        reader, writer = await running.connect()
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"2\r\nab\r\n" * 300)  # 600 bytes of body in 2-byte chunks
        response = await read_response(reader)
        assert response.status == 400
        assert response.json()["error"]["code"] == "chunks_too_small"
        assert await closed_by_server(reader)
        writer.close()
        reader, writer = await running.connect()
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"2\r\nab\r\n" * 250 + b"0\r\n\r\n")  # within the count: any size
        response = await read_response(reader)
        assert (response.status, len(response.json()["body"])) == (200, 500)
        writer.close()
        reader, writer = await running.connect()
        chunks = (b"400\r\n" + b"k" * 1024 + b"\r\n") * 100  # 100 KiB in 1 KiB chunks
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(chunks + b"0\r\n\r\n")
        response = await read_response(reader)
        assert (response.status, len(response.json()["body"])) == (200, 100 * 1024)
        writer.close()
    finally:
        running.server.close()


@pytest.mark.parametrize("chunks", [256, 257])
async def test_tiny_chunks_are_counted_as_chunks_however_the_reads_cut_them(chunks: int) -> None:
    # A read ending inside a chunk gives it two body callbacks: counted that way, 256 chunks
    # cut into many reads, or pipelined behind a GET, were refused as if they were more.
    limits = dataclasses.replace(LIMITS, max_body_size=1 << 20)
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    request = head + chunked(b"k" * 17 * chunks, 17)
    expected = 200 if chunks == 256 else 400
    ways = {
        "one read": [request],
        "behind a GET": [get() + request],
        "reads of 10 bytes": [request[i : i + 10] for i in range(0, len(request), 10)],
    }
    for way, pieces in ways.items():
        statuses = [status for status, _ in split_responses(await feed_pieces(pieces, limits))]
        assert statuses[-1] == expected, way


async def test_an_upload_dropped_midway_is_freed_at_once_without_the_cyclic_gc() -> None:
    running = await start(dataclasses.replace(LIMITS, max_body_size=1 << 20))
    gc.disable()
    try:
        _reader, writer = await running.connect()
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n")
        writer.write(b"x" * 300_000)
        await wait_for(lambda: running.registry.bodies.held == 300_000)  # what arrived
        protocol = running.protocols[0]
        writer.transport.abort()  # the client goes away mid-upload
        await wait_for(lambda: protocol() is None)  # freed by reference counting alone
        assert running.registry.bodies.held == 0
    finally:
        gc.enable()
        running.server.close()


async def test_a_body_over_the_shared_budget_gets_503_overloaded_and_the_budget_comes_back() -> (
    None
):
    registry = ConnectionRegistry(body_budget=2500)
    running = await start(registry=registry)
    try:
        holders = []
        for _ in range(2):  # 2 x 1000 bytes announced, 999 of each sent: held as they arrive
            reader, writer = await running.connect()
            writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
            writer.write(b"h" * 999)
            holders.append((reader, writer))
        await wait_for(lambda: registry.bodies.held == 1998)
        reader, writer = await running.connect()
        writer.write(post("/echo", b"y" * 600))
        response = await read_response(reader)
        assert response.status == 503
        assert response.json()["error"]["code"] == "overloaded"
        assert response.headers["retry-after"] == "1"
        assert await closed_by_server(reader)
        writer.close()
        for _, holder in holders:
            holder.transport.abort()
        await wait_for(lambda: registry.bodies.held == 0)
        reader, writer = await running.connect()
        writer.write(post("/echo", b"y" * 600))
        assert (await read_response(reader)).json()["body"] == "y" * 600
        writer.close()
    finally:
        running.server.close()


async def test_a_chunked_body_that_outgrows_the_budget_gets_503_while_reading() -> None:
    registry = ConnectionRegistry(body_budget=1500)
    running = await start(dataclasses.replace(LIMITS, max_body_size=1400), registry=registry)
    try:
        _holder_reader, holder = await running.connect()
        holder.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        holder.write(b"h" * 999)
        await wait_for(lambda: registry.bodies.held == 999)
        reader, writer = await running.connect()
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"190\r\n" + b"z" * 400 + b"\r\n")  # 400: fits
        writer.write(b"190\r\n" + b"z" * 400 + b"\r\n")  # 800: does not
        response = await read_response(reader)
        assert (response.status, response.json()["error"]["code"]) == (503, "overloaded")
        holder.close()
        writer.close()
        await wait_for(lambda: registry.bodies.held == 0)
    finally:
        running.server.close()


async def test_a_declared_body_holds_of_the_budget_only_the_bytes_that_arrived() -> None:
    registry = ConnectionRegistry(body_budget=1500)
    running = await start(registry=registry)
    try:
        _, holder = await running.connect()  # declares 1000, sends 300, then nothing
        holder.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        holder.write(b"a" * 300)
        await wait_for(lambda: registry.bodies.held >= 300)
        assert registry.bodies.held == 300
        reader, writer = await running.connect()  # 300 + 1000 fit in 1500: served
        writer.write(post("/echo", b"b" * 1000))
        assert (await read_response(reader)).json()["body"] == "b" * 1000
        assert registry.bodies.held == 300
        holder.write(b"a" * 700)  # the rest arrives: held whole until its answer
        writer.close()
        holder.close()
        await wait_for(lambda: registry.bodies.held == 0)
    finally:
        running.server.close()


async def test_the_body_budget_returns_to_zero_after_waves_of_aborted_uploads() -> None:
    registry = ConnectionRegistry(body_budget=1 << 30)
    running = await start(dataclasses.replace(LIMITS, max_body_size=1 << 20), registry=registry)
    try:
        for wave in range(4):
            writers = []
            for n in range(10):
                _, writer = await running.connect()
                if n % 2:
                    writer.write(b"POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 500000\r\n\r\n")
                    writer.write(b"a" * (n * 10_000))
                else:
                    writer.write(
                        b"POST /e HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                    )
                    writer.write(chunked(b"b" * (n * 10_000 + 1), 333)[:-5])  # never ends
                writers.append(writer)
            await wait_for(lambda: registry.bodies.held > 0)
            for writer in writers:
                writer.transport.abort()
            await wait_for(lambda: registry.bodies.held == 0 and len(registry) == 0)
            assert wave == wave  # each wave starts from nothing held
    finally:
        running.server.close()


async def test_a_body_is_held_against_the_budget_until_its_exchange_ends(server: Server) -> None:
    reader, writer = await server.connect()
    writer.write(post("/hang", b"h" * 700))
    await wait_for(lambda: server.app.listeners and server.registry.active == 1)
    assert server.registry.bodies.held == 700  # the handler still has it
    writer.close()
    await wait_for(lambda: server.app.listeners[0].lost)
    assert server.registry.bodies.held == 0
    reader, writer = await server.connect()
    writer.write(post("/echo", b"e" * 300))
    assert (await read_response(reader)).status == 200
    assert server.registry.bodies.held == 0  # answered: released
    writer.close()


async def test_a_large_body_in_many_reads_is_dispatched_whole_and_in_order() -> None:
    # Bodies from 1 MiB are joined in a thread; the requests behind wait their turn.
    running = await start(dataclasses.replace(LIMITS, max_body_size=4 << 20))
    try:
        reader, writer = await running.connect()
        body = bytes(range(97, 123)) * 100_000  # 2.6 MB
        writer.write(get("/first") + post("/echo", body) + get("/third"))
        paths = []
        for _ in range(3):
            document = (await read_response(reader)).json()
            paths.append(document["path"])
            if document["path"] == "/echo":
                assert document["body"].encode() == body
        assert paths == ["/first", "/echo", "/third"]
        assert running.registry.bodies.held == 0
        writer.close()
    finally:
        running.server.close()


async def test_a_large_read_is_parsed_a_slice_per_loop_iteration() -> None:
    # One read of a body in small chunks costs up to ~30 ns a byte to parse: a 256 KB read
    # parsed at once held the loop for 6-9 ms; a slice of it is a fraction of that.
    app = EchoApp()
    limits = dataclasses.replace(LIMITS, max_body_size=1 << 20)
    protocol = HttpServerProtocol(app, limits, ConnectionRegistry(), asyncio.get_running_loop())
    transport = RecordingTransport()
    protocol.connection_made(transport)
    frames = (b"80\r\n" + b"ab" * 64 + b"\r\n") * 500  # 64,000 body bytes, 67,500 framed
    protocol.data_received(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        + frames
        + b"0\r\n\r\n"
    )
    assert 0 < protocol._message.body_size < 16_384  # one slice of 16 KiB parsed, the rest later
    await wait_for(lambda: app.dispatched == 1)
    assert split_responses(bytes(transport.written))[0][0] == 200
    assert json.loads(split_responses(bytes(transport.written))[0][1])["body"] == "ab" * 32_000
    protocol.connection_lost(None)


# -- protocol faults ------------------------------------------------------------------------


SPLIT_LIMITS = ServerLimits(
    max_header_size=512, max_body_size=8192, keepalive_timeout=5.0, max_pipeline=64
)
_TOKEN = st.text(alphabet="abcdefghij", min_size=1, max_size=8)
_VALUE = st.text(alphabet="abcdefghij0123456789-_.", max_size=60)
_BODY = st.builds(
    lambda seed, size: (seed * size)[:size].encode(),
    st.text(alphabet='abc{}[]":, 0123456789', min_size=1, max_size=20),
    st.integers(0, 6000),
)
"""Bodies of any size up to 6000 (a plain text strategy would keep nearly all of them short)."""


@st.composite
def split_pipeline(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """Valid requests within SPLIT_LIMITS (GETs, Content-Length and chunked POSTs), and the
    same bytes cut into reads: anywhere, and near where one request ends and the next begins
    (inside a body's tail, a head's first bytes), where accounting goes wrong."""
    raw = b""
    cuts = draw(st.lists(st.integers(0, 100_000), max_size=4))
    for _ in range(draw(st.integers(1, 6))):
        path = "/" + draw(_TOKEN)
        headers = [f"X-{draw(_TOKEN)}: {draw(_VALUE)}" for _ in range(draw(st.integers(0, 5)))]
        kind = draw(st.sampled_from(["get", "post", "chunked"]))
        if kind == "get":
            raw += get(path, *headers)
        elif kind == "post":
            raw += post(path, draw(_BODY), *headers)
        else:
            body = draw(_BODY)
            lines = [f"POST {path} HTTP/1.1", "Host: t", "Transfer-Encoding: chunked", *headers]
            raw += "\r\n".join([*lines, "", ""]).encode()
            smallest = -(-len(body) // 256)  # more chunks, if tiny, are refused by design
            raw += chunked(body, draw(st.integers(smallest, 3000))) if body else b"0\r\n\r\n"
        if draw(st.booleans()):
            cuts.append(len(raw) + draw(st.integers(-300, 300)))
    points = sorted({min(max(cut, 0), len(raw)) for cut in cuts} | {0, len(raw)})
    return raw, [raw[start:end] for start, end in itertools.pairwise(points)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split=split_pipeline())
async def test_any_split_of_valid_pipelined_requests_gets_the_same_answers(
    split: tuple[bytes, list[bytes]],
) -> None:
    # A read ending inside a head once counted all its bytes (a previous request's body
    # and other requests included) toward the header limit: spurious 431s.
    raw, pieces = split
    whole = split_responses(await feed_pieces([raw], SPLIT_LIMITS))
    assert {status for status, _ in whole} == {200}
    assert split_responses(await feed_pieces(pieces, SPLIT_LIMITS)) == whole


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", 400),
        (b"GET / HTTP/1.0\r\n\r\n", 200),
        (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
        (b"GET /\r\n\r\n", 400),
        (b"GET / HTTP/0.9\r\nHost: a\r\n\r\n", 400),
    ],
    ids=["11-no-host", "11-two-hosts", "10-two-hosts", "10-no-host", "http2", "http09", "v09"],
)
async def test_host_and_version_are_checked(server: Server, raw: bytes, status: int) -> None:
    reader, writer = await server.connect()
    writer.write(raw)
    response = await read_response(reader)
    assert response.status == status
    if status != 200:
        assert set(response.json()["error"]) == {"message", "type", "code"}
        assert await closed_by_server(reader)
    writer.close()


async def test_a_head_that_stops_arriving_gets_408_after_the_header_timeout() -> None:
    running = await start(dataclasses.replace(LIMITS, header_timeout=0.3, keepalive_timeout=30))
    try:
        reader, writer = await running.connect()
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        for _ in range(3):  # a few more bytes, then silence: the clock started with the head
            writer.write(b"a")
            await writer.drain()
        response = await read_response(reader)
        assert (response.status, response.json()["error"]["code"]) == (408, "request_timeout")
        assert await closed_by_server(reader)
        writer.close()
    finally:
        running.server.close()


async def test_a_body_that_stops_arriving_gets_408_after_the_idle_timeout() -> None:
    running = await start(dataclasses.replace(LIMITS, header_timeout=30, keepalive_timeout=0.3))
    try:
        reader, writer = await running.connect()
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nonly this")
        response = await read_response(reader)
        assert response.status == 408
        writer.close()
    finally:
        running.server.close()


# -- back-pressure: a client that does not read cannot make the server produce ------------


async def test_a_client_that_never_reads_does_not_get_answers_made_ahead() -> None:
    # Pipelining requests for answers the server makes itself and never reading them once
    # grew the router to 2 GiB: the next request was dispatched while writes were paused.
    running = await start(send_buffer=8192)
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", running.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        count = 1000
        writer.write(b"".join(get(f"/big?{16384 + n}") for n in range(count)))
        protocol = running.protocols[0]()
        assert protocol is not None
        await wait_for(lambda: protocol._write_paused)
        # The server had every chance to answer ahead: it read and parsed requests until its
        # pipeline was full (each parse ends by offering the queue for dispatch), and
        # stopped reading. A wrongly eager server shows itself by dispatching on instead.
        await wait_for(
            lambda: (
                running.app.dispatched >= 40
                or (protocol._read_paused and len(protocol._queue) >= LIMITS.max_pipeline)
            )
        )
        assert running.app.dispatched < 40, running.app.dispatched
        for n in range(count):  # then the client reads, and gets every answer, in order
            assert len((await read_response(reader)).body) == 16384 + n
        assert running.app.dispatched == count
        writer.close()
    finally:
        running.server.close()


async def test_a_client_that_stops_reading_a_stream_is_dropped_and_its_exchange_released() -> None:
    running = await start(dataclasses.replace(LIMITS, send_timeout=0.3), send_buffer=8192)
    try:
        _reader, writer = await running.connect()
        writer.write(get("/flood"))
        await wait_for(lambda: running.app.listeners and running.app.listeners[0].paused)
        await wait_for(lambda: running.app.listeners[0].lost)  # within TIMEOUT, after ~0.3 s
        assert running.registry.active == 0
        assert len(running.registry) == 0
        writer.close()
    finally:
        running.server.close()


async def test_a_closing_connection_whose_client_never_reads_is_dropped_in_time() -> None:
    # An answer under the write buffer's high-water mark never pauses writing, and a close
    # waits for the buffer to drain: without a bound the connection stays open for good.
    running = await start(dataclasses.replace(LIMITS, send_timeout=0.3), send_buffer=8192)
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", running.port))
        await asyncio.get_running_loop().sock_sendall(sock, get("/big?60000", "Connection: close"))
        await wait_for(lambda: running.app.dispatched == 1)
        await wait_for(lambda: len(running.registry) == 0)  # never read, yet not held open
        sock.close()
    finally:
        running.server.close()


# -- the connection limit -------------------------------------------------------------------


async def test_a_connection_over_the_limit_gets_503_and_is_closed() -> None:
    refused: list[int] = []
    registry = ConnectionRegistry(limit=2, on_full=lambda: refused.append(1))
    running = await start(registry=registry)
    try:
        open_ = []
        for n in range(2):
            reader, writer = await running.connect()
            writer.write(get(f"/{n}"))
            assert (await read_response(reader)).status == 200
            open_.append(writer)
        reader, writer = await running.connect()
        response = await read_response(reader)
        assert response.status == 503
        assert response.json()["error"]["code"] == "too_many_connections"
        assert await closed_by_server(reader)
        assert refused == [1]
        writer.close()
        open_.pop().close()
        await wait_for(lambda: len(registry) == 1)
        reader, writer = await running.connect()
        writer.write(get("/again"))
        assert (await read_response(reader)).status == 200
        writer.close()
    finally:
        running.server.close()
