"""The RESP client on sockets: pipelined calls, error replies, and every failure bounded and
backed off, so a dead Redis is dialled once per back-off however many calls come.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from headcount.clock import Clock
from headcount.flow.resp import RedisUnavailable, RespClient, RespError, Script
from tests.support import FakeClock, blackholed_listener, wait_until
from tests.support.redis import RedisServer
from tests.support.redis import redis_server as redis_server

__all__: list[str] = []

MARGIN = 0.5
"""Beyond the client's timeout, what a loaded machine may add before an answer."""


@asynccontextmanager
async def client(
    port: int,
    timeout: float = 2.0,
    *,
    clock: Clock = time.monotonic,
    backoff: tuple[float, float] = (0.2, 2.0),
) -> AsyncIterator[RespClient]:
    made = RespClient("127.0.0.1", port, timeout=timeout, clock=clock, backoff=backoff)
    try:
        yield made
    finally:
        await made.close()


async def test_concurrent_calls_share_one_connection_in_order(redis_server: RedisServer) -> None:
    async with client(redis_server.port) as redis:
        replies = await asyncio.gather(*(redis.call("INCR", "n") for _ in range(500)))
        assert sorted(replies) == list(range(1, 501))  # type: ignore[type-var]
        clients = await redis.call("CLIENT", "LIST")
        assert isinstance(clients, bytes) and clients.count(b"\n") == 1


async def test_an_error_reply_fails_that_call_only(redis_server: RedisServer) -> None:
    async with client(redis_server.port) as redis:
        before = await redis.call("CLIENT", "ID")
        with pytest.raises(RespError, match="unknown command"):
            await redis.call("NO-SUCH-COMMAND")
        assert await redis.call("CLIENT", "ID") == before


async def test_a_script_unknown_to_redis_is_loaded_and_run(redis_server: RedisServer) -> None:
    script = Script("return {KEYS[1], ARGV[1] + 1}")
    async with client(redis_server.port) as redis:
        assert await redis.evalsha(script, ["k"], [41]) == [b"k", 42]
        assert await redis.call("SCRIPT", "EXISTS", script.sha) == [1]
        assert await redis.evalsha(script, ["k"], [1]) == [b"k", 2]
        with pytest.raises(RespError, match="compiling"):
            await redis.evalsha(Script("return {"), [], [])


async def test_a_stopped_redis_is_named_then_dialled_again(redis_server: RedisServer) -> None:
    async with client(redis_server.port, timeout=0.1, backoff=(0.01, 0.01)) as redis:
        assert await redis.call("PING") == b"PONG"
        await redis_server.stop()
        with pytest.raises(RedisUnavailable):
            await asyncio.wait_for(redis.call("PING"), 0.1 + MARGIN)
        await redis_server.start()

        async def pong() -> bool:
            reply = await redis.call("PING")
            return reply == b"PONG"

        await wait_until(pong, what="PONG from the restarted Redis")


@asynccontextmanager
async def hanging_up() -> AsyncIterator[tuple[int, list[int]]]:
    """A port that accepts and closes at once; the list counts the connections."""
    accepted: list[int] = []

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        server.close()
        await server.wait_closed()


async def test_after_a_failure_calls_fail_at_once_until_the_back_off_ends() -> None:
    clock = FakeClock()
    async with (
        hanging_up() as (port, accepted),
        client(port, timeout=1.0, clock=clock, backoff=(0.2, 0.5)) as redis,
    ):
        # ten calls fail with one connection: one failure, not ten in a row
        failed = await asyncio.gather(
            *(redis.call("PING") for _ in range(10)), return_exceptions=True
        )
        assert all(isinstance(f, RedisUnavailable) for f in failed)
        for _ in range(50):
            with pytest.raises(RedisUnavailable, match=r"closed by Redis|reset"):
                await redis.call("PING")
        assert len(accepted) == 1
        clock.advance(0.2)
        with pytest.raises(RedisUnavailable):
            await redis.call("PING")
        assert len(accepted) == 2
        clock.advance(0.2)  # the second failure in a row backs off 0.4 s
        with pytest.raises(RedisUnavailable):
            await redis.call("PING")
        assert len(accepted) == 2
        clock.advance(0.2)
        with pytest.raises(RedisUnavailable):
            await redis.call("PING")
        assert len(accepted) == 3
        clock.advance(0.5)  # at most 0.5 s
        with pytest.raises(RedisUnavailable):
            await redis.call("PING")
        assert len(accepted) == 4


async def test_a_dial_that_hangs_is_bounded_by_the_timeout() -> None:
    with blackholed_listener() as port:
        async with client(port, timeout=0.1) as redis:
            calls = asyncio.gather(*(redis.call("PING") for _ in range(20)), return_exceptions=True)
            outcomes = await asyncio.wait_for(calls, 0.1 + MARGIN)
            assert {str(o) for o in outcomes} == {"no answer within 100ms"}
            assert all(isinstance(o, RedisUnavailable) for o in outcomes)
