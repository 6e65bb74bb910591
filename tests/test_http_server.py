"""The client-facing HTTP/1.1 server, as clients use it: raw sockets, byte-split input, order.

Most tests speak raw HTTP to a real server on 127.0.0.1 through
`asyncio.open_connection`; the byte-split tests feed a connection's protocol one
byte at a time (TCP would coalesce such writes) through a minimal transport.
The handler here echoes what it received, answers `/slow` late and streams
`/stream` in parts, so each test reads as a client's conversation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from headcount._http.connections import ConnectionRegistry
from headcount._http.handler import Request, Responder
from headcount._http.server import HttpServerProtocol, ServerLimits
from tests.support import wait_until

TIMEOUT = 5.0
LIMITS = ServerLimits(
    max_header_size=4096, max_body_size=1000, keepalive_timeout=5.0, max_pipeline=16
)


class Lost:
    """An ExchangeListener that remembers whether its client went away."""

    def __init__(self) -> None:
        self.lost = False

    def client_lost(self) -> None:
        self.lost = True

    def client_paused(self) -> None:
        pass

    def client_resumed(self) -> None:
        pass


class EchoApp:
    """Answers with what it received; `/slow` answers after a delay, `/stream` in parts."""

    def __init__(self) -> None:
        self.listeners: list[Lost] = []

    def __call__(self, request: Request, responder: Responder) -> None:
        if request.path == b"/slow":
            listener = Lost()
            self.listeners.append(listener)
            responder.attach(listener)
            asyncio.get_running_loop().call_later(0.2, self._echo, request, responder)
        elif request.path == b"/stream":
            responder.start(200, b"OK", b"content-type: text/plain\r\n", None, b"one,", False)
            loop = asyncio.get_running_loop()
            loop.call_later(0.02, responder.write, b"two,", False)
            loop.call_later(0.04, responder.write, b"three", True)
        elif request.path == b"/nodelay":
            sock = responder._transport.get_extra_info("socket")  # type: ignore[attr-defined]
            nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            responder.respond(200, b"", b"%d" % nodelay)
        elif request.path == b"/hang":
            listener = Lost()
            self.listeners.append(listener)
            responder.attach(listener)
        else:
            self._echo(request, responder)

    def _echo(self, request: Request, responder: Responder) -> None:
        document = {
            "method": request.method.decode(),
            "path": request.path.decode(),
            "query": request.query.decode(),
            "headers": {name.decode(): value.decode() for name, value in request.headers},
            "body": request.body.decode(),
        }
        responder.respond(200, b"content-type: application/json\r\n", json.dumps(document).encode())


class Server:
    def __init__(self, server: asyncio.Server, app: EchoApp, registry: ConnectionRegistry) -> None:
        self.server = server
        self.app = app
        self.registry = registry
        self.port: int = server.sockets[0].getsockname()[1]

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), TIMEOUT)


async def start(limits: ServerLimits = LIMITS) -> Server:
    loop = asyncio.get_running_loop()
    app = EchoApp()
    registry = ConnectionRegistry()
    server = await loop.create_server(
        lambda: HttpServerProtocol(app, limits, registry, loop), "127.0.0.1", 0
    )
    return Server(server, app, registry)


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


async def wait_for(condition: Callable[[], object]) -> None:
    await wait_until(condition, timeout=TIMEOUT)


# -- byte-split input -----------------------------------------------------------------------


class RecordingTransport(asyncio.Transport):
    """The least a protocol needs from a transport: it records what is written."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def feed_bytewise(data: bytes, limits: ServerLimits = LIMITS) -> bytes:
    """Feed `data` one byte per read to a fresh connection; return what it wrote back."""
    loop = asyncio.get_running_loop()
    transport = RecordingTransport()
    protocol = HttpServerProtocol(EchoApp(), limits, ConnectionRegistry(), loop)
    protocol.connection_made(transport)
    for index in range(len(data)):
        protocol.data_received(data[index : index + 1])
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
