"""Upstream connections and pools against tiny scripted HTTP servers on 127.0.0.1.

Each test's engine is a few lines of asyncio streams saying exactly what an
engine might say: content-length, chunked and until-close bodies, keep-alive or
not, silence, a close at the worst moment. The listener records what the
connection reported, as the proxy would hear it. The scripted engines
(`raw_engine`) and the blackholed port are in tests/support/raw_engine.py,
shared with test_proxy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from typing import Any

import pytest

from headcount._http.errors import (
    ConnectFailed,
    ConnectTimeout,
    NoResponse,
    StaleConnection,
    StreamBroken,
    UpstreamError,
    UpstreamTimeout,
)
from headcount._http.pool import PoolOptions, UpstreamPool, Upstreams
from headcount._http.resolve import Resolver
from headcount._http.upstream import ResponseHead, ResponseListener
from headcount.config import DnsSettings
from headcount.sim.loopback import free_port
from tests.support import EngineConnection, Script, blackholed_listener, raw_engine, wait_until

__all__: list[str] = []

TIMEOUT = 5.0
RESOLVER = Resolver(DnsSettings().timeout)
REQUEST = b"POST /v1/completions HTTP/1.1\r\nhost: engine\r\ncontent-length: 2\r\n\r\n{}"
OK_HELLO = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: text/plain\r\n\r\nhello"


def answering(*responses: bytes, then_close: bool = False) -> Script:
    """A script that answers each request with the next response (the last one repeats)."""

    async def script(conn: EngineConnection) -> None:
        index = 0
        while await conn.read_request() is not None:
            await conn.send(responses[min(index, len(responses) - 1)])
            index += 1
            if then_close:
                return

    return script


class Recorder(ResponseListener):
    """A ResponseListener that keeps what it heard."""

    def __init__(self) -> None:
        self.head: ResponseHead | None = None
        self.parts: list[bytes] = []
        self.complete = False
        self.error: UpstreamError | None = None
        self.done = asyncio.Event()

    def on_response(self, head: ResponseHead | None, body: bytes, complete: bool) -> None:
        assert not self.done.is_set()
        if head is not None:
            assert self.head is None
            self.head = head
        if body:
            self.parts.append(body)
        if complete:
            self.complete = True
            self.done.set()

    def on_upstream_error(self, error: UpstreamError) -> None:
        assert not self.done.is_set()
        self.error = error
        self.done.set()

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)

    async def heard(self, parts: int) -> None:
        """Wait until the connection has handed this listener `parts` body pieces."""
        await wait_until(lambda: len(self.parts) >= parts, timeout=TIMEOUT, what="body parts")

    async def wait(self) -> Recorder:
        await asyncio.wait_for(self.done.wait(), TIMEOUT)
        return self


OPTIONS = PoolOptions(
    connect_timeout=1.0,
    read_timeout=5.0,
    idle_timeout=5.0,
    max_idle=8,
    max_head_size=4096,
    resolver=RESOLVER,
)


def make_pool(url: str, **overrides: Any) -> UpstreamPool:
    return UpstreamPool(url, dataclasses.replace(OPTIONS, **overrides))


async def exchange(pool: UpstreamPool, request: bytes = REQUEST) -> Recorder:
    """Send one request on a pooled or new connection; wait for its end."""
    conn = pool.take() or await pool.connect()
    recorder = Recorder()
    conn.send(request, recorder)
    return await recorder.wait()


# -- framing --------------------------------------------------------------------------------


async def test_an_answer_before_the_whole_request_went_out_is_not_pooled() -> None:
    # An engine that answers after the head alone would read the rest of the body as the
    # next request: the connection must not carry another exchange.
    async def answer_after_the_head(conn: EngineConnection) -> None:
        await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        await conn.send(OK_HELLO)
        await asyncio.wait_for(conn.reader.read(), TIMEOUT)  # until the router closes

    body = b"x" * (32 << 20)  # more than the socket buffers hold
    request = b"POST / HTTP/1.1\r\nhost: e\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    async with raw_engine(answer_after_the_head) as engine:
        pool = make_pool(engine.url)
        result = await exchange(pool, request)
        assert result.complete and result.body == b"hello"
        assert pool.idle == 0
        pool.close()


async def test_content_length_response_is_delivered_and_connection_pooled() -> None:
    async with raw_engine(answering(OK_HELLO)) as engine:
        pool = make_pool(engine.url)
        result = await exchange(pool)
        assert result.error is None and result.complete
        assert result.head is not None
        assert (result.head.status, result.head.reason, result.head.content_length) == (
            200,
            b"OK",
            5,
        )
        assert (b"content-type", b"text/plain") in result.head.headers
        assert result.body == b"hello"
        assert pool.idle == 1
        pool.close()


async def test_chunked_response_arrives_piece_by_piece() -> None:
    result = Recorder()

    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await wait_until(lambda: result.head is not None, timeout=TIMEOUT, what="the head")
        for sent, word in enumerate((b"alpha ", b"beta ", b"gamma")):
            await result.heard(sent)  # separate reads on the router's side
            await conn.send(b"%x\r\n%s\r\n" % (len(word), word))
        await conn.send(b"0\r\n\r\n")
        await conn.read_request()

    async with raw_engine(script) as engine:
        pool = make_pool(engine.url)
        conn = await pool.connect()
        conn.send(REQUEST, result)
        await result.wait()
        assert result.head is not None and result.head.content_length is None
        assert result.body == b"alpha beta gamma"
        assert len(result.parts) == 3
        assert pool.idle == 1
        pool.close()


async def test_response_without_length_ends_with_the_connection() -> None:
    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ")
        await conn.until_read()  # "close" comes in a later read
        await conn.send(b"close")
        conn.close()

    async with raw_engine(script) as engine:
        pool = make_pool(engine.url)
        result = await exchange(pool)
        assert result.error is None and result.complete
        assert result.body == b"until close"
        assert pool.idle == 0


async def test_interim_100_continue_is_skipped() -> None:
    response = b"HTTP/1.1 100 Continue\r\n\r\n" + OK_HELLO
    async with raw_engine(answering(response)) as engine:
        pool = make_pool(engine.url)
        result = await exchange(pool)
        assert result.head is not None and result.head.status == 200
        assert result.body == b"hello"
        pool.close()


# -- keep-alive -----------------------------------------------------------------------------


async def test_keep_alive_reuses_one_connection() -> None:
    async with raw_engine(answering(OK_HELLO)) as engine:
        pool = make_pool(engine.url)
        for _ in range(3):
            assert (await exchange(pool)).body == b"hello"
        assert engine.accepted == 1
        pool.close()


async def test_upstream_sockets_have_nodelay_and_keepalive() -> None:
    async with raw_engine(answering(OK_HELLO)) as engine:
        conn = await make_pool(engine.url).connect()
        sock = conn._transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        conn.close()


async def test_connection_paused_as_its_response_completed_still_reads_the_next() -> None:
    async with raw_engine(answering(OK_HELLO)) as engine:
        pool = make_pool(engine.url)
        conn = await pool.connect()

        class PausingRecorder(Recorder):
            def on_response(self, head: ResponseHead | None, body: bytes, complete: bool) -> None:
                super().on_response(head, body, complete)
                conn.pause_reading()  # the client's buffer filled on the last write

        conn.send(REQUEST, PausingRecorder())
        await wait_until(lambda: pool.idle == 1, timeout=TIMEOUT)
        assert (await exchange(pool)).body == b"hello"
        pool.close()


async def test_connection_close_response_is_not_pooled() -> None:
    closing = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
    async with raw_engine(answering(closing, then_close=True)) as engine:
        pool = make_pool(engine.url)
        for _ in range(2):
            assert (await exchange(pool)).body == b"ok"
        assert pool.idle == 0
        assert engine.accepted == 2


async def test_reused_connection_closed_by_the_engine_reports_stale() -> None:
    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.send(OK_HELLO)
        await conn.read_request()  # the next request is never answered: the engine "restarted"
        conn.writer.transport.abort()

    async with raw_engine(script) as engine:
        pool = make_pool(engine.url)
        assert (await exchange(pool)).body == b"hello"
        result = await exchange(pool)
        assert isinstance(result.error, StaleConnection)


async def test_fresh_connection_closed_before_any_byte_reports_no_response() -> None:
    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        conn.close()

    async with raw_engine(script) as engine:
        result = await exchange(make_pool(engine.url))
        assert isinstance(result.error, NoResponse)
        assert not isinstance(result.error, StaleConnection)


async def test_idle_connection_closed_by_the_engine_leaves_the_pool() -> None:
    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.send(OK_HELLO)
        conn.close()  # keep-alive promised, then closed while idle

    async with raw_engine(script) as engine:
        pool = make_pool(engine.url)
        await exchange(pool)
        await wait_until(lambda: pool.idle == 0, timeout=TIMEOUT)
        assert pool.take() is None


async def test_idle_connection_is_closed_after_idle_timeout() -> None:
    eof_seen = asyncio.Event()

    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.send(OK_HELLO)
        if await conn.read_request() is None:
            eof_seen.set()

    async with raw_engine(script) as engine:
        pool = make_pool(engine.url, idle_timeout=0.2)
        await exchange(pool)
        assert pool.idle == 1
        await asyncio.wait_for(eof_seen.wait(), TIMEOUT)
        assert pool.idle == 0


async def test_pool_bounds_idle_connections() -> None:
    async with raw_engine(answering(OK_HELLO)) as engine:
        pool = make_pool(engine.url, max_idle=2)
        connections = [await pool.connect() for _ in range(3)]
        recorders = [Recorder() for _ in connections]
        for conn, recorder in zip(connections, recorders, strict=True):
            conn.send(REQUEST, recorder)
        for recorder in recorders:
            await recorder.wait()
        assert pool.idle == 2
        pool.close()


def small_upstreams() -> Upstreams:
    return Upstreams(OPTIONS)


async def test_closing_a_pool_closes_its_idle_connections() -> None:
    async with raw_engine(answering(OK_HELLO)) as engine:
        upstreams = small_upstreams()
        pool = upstreams.pool("engine-1", engine.url)
        assert upstreams.pool("engine-1", engine.url) is pool
        await exchange(pool)
        assert pool.idle == 1
        upstreams.drop(["engine-1"])
        assert pool.idle == 0 and len(upstreams) == 0
        late = await pool.connect()  # a connection that finishes after its pool closed
        recorder = Recorder()
        late.send(REQUEST, recorder)
        await recorder.wait()
        assert pool.idle == 0
        await wait_until(lambda: late.closed, timeout=TIMEOUT)


async def test_a_new_url_for_the_same_engine_gets_a_new_pool() -> None:
    upstreams = small_upstreams()
    first = upstreams.pool("engine-1", "http://127.0.0.1:1")
    second = upstreams.pool("engine-1", "http://127.0.0.1:2")
    assert first is not second
    assert (second.host, second.port, second.host_header) == (
        "127.0.0.1",
        2,
        b"host: 127.0.0.1:2\r\n",
    )
    upstreams.close()


# -- failures -------------------------------------------------------------------------------


async def test_refused_connect_raises_connect_failed() -> None:
    pool = make_pool(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConnectFailed):
        await pool.connect()


async def test_connect_timeout_against_a_blackholed_address() -> None:
    with blackholed_listener() as port:
        pool = make_pool(f"http://127.0.0.1:{port}", connect_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(ConnectTimeout) as caught:
            await pool.connect()
        assert 0.25 < time.monotonic() - started < 3.0
        assert isinstance(caught.value, UpstreamTimeout)
        assert isinstance(caught.value, ConnectFailed)


async def test_silent_engine_times_out_after_read_timeout() -> None:
    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.reader.read()  # never answers

    async with raw_engine(script) as engine:
        pool = make_pool(engine.url, read_timeout=0.3)
        started = time.monotonic()
        result = await exchange(pool)
        assert isinstance(result.error, UpstreamTimeout)
        assert 0.25 < time.monotonic() - started < 3.0
        assert pool.idle == 0


async def test_each_read_moves_the_read_deadline() -> None:
    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(6):
            await asyncio.sleep(0.1)
            await conn.send(b"1\r\nx\r\n")
        await conn.send(b"0\r\n\r\n")
        await conn.read_request()

    async with raw_engine(script) as engine:
        pool = make_pool(engine.url, read_timeout=0.3)
        result = await exchange(pool)  # 0.6 s in all, never 0.3 s silent
        assert result.error is None
        assert result.body == b"xxxxxx"
        pool.close()


async def test_malformed_response_is_a_broken_stream() -> None:
    async with raw_engine(answering(b"SPDY/9 what\r\n\r\n")) as engine:
        result = await exchange(make_pool(engine.url))
        assert isinstance(result.error, StreamBroken)


async def test_close_mid_body_is_a_broken_stream() -> None:
    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        conn.close()

    async with raw_engine(script) as engine:
        result = await exchange(make_pool(engine.url))
        assert result.head is not None and result.parts == [b"partial"]
        assert isinstance(result.error, StreamBroken)


async def test_cancel_closes_the_connection_without_reporting() -> None:
    eof_seen = asyncio.Event()

    async def script(conn: EngineConnection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        if not await conn.reader.read():
            eof_seen.set()

    async with raw_engine(script) as engine:
        pool = make_pool(engine.url)
        conn = await pool.connect()
        recorder = Recorder()
        conn.send(REQUEST, recorder)
        await wait_until(lambda: recorder.parts, timeout=TIMEOUT)
        conn.cancel()
        await asyncio.wait_for(eof_seen.wait(), TIMEOUT)
        assert recorder.error is None and not recorder.complete
        assert pool.idle == 0
