"""The Redis limits store against a real redis-server: judged like the in-process store, shared
by replicas, and admitting (fail-open) within its timeout when Redis is gone or silent.
"""

from __future__ import annotations

import asyncio
import random
import time

from headcount.flow.limits import Charge, Quota, StoreHealth, Verdict
from headcount.flow.redis_store import TTL, UNCOUNTED, RedisStore
from headcount.flow.resp import RespClient
from headcount.flow.window import MemoryStore
from headcount.sim.loopback import free_port
from tests.support import FakeClock, wait_until
from tests.support.redis import RedisServer
from tests.support.redis import redis_server as redis_server

__all__: list[str] = []

START = 1_700_000_040.0
UNJUDGED = Verdict(True, None, None, 0.0, UNCOUNTED, "")
MARGIN = 0.5
"""Beyond the store's timeout, what a loaded machine may add before an answer."""


def charge(rpm: int = 0, tpm: int = 0, tokens: int = 0, tenant: str = "t") -> Charge:
    return Charge(tenant, rpm, tpm, tokens)


async def inspect(server: RedisServer, *command: str) -> object:
    client = RespClient("127.0.0.1", server.port, timeout=5.0)
    try:
        return await client.call(*command)
    finally:
        await client.close()


async def test_counts_and_refuses_in_redis_under_expiring_keys(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, 1.0, clock=FakeClock(START + 15))
    try:
        verdicts = [await store.take(charge(2, 100, 30, tenant="chat")) for _ in range(3)]
        assert [v.reason for v in verdicts] == ["", "", "requests_per_minute"]
        assert verdicts[1].requests == Quota(2, 0, 105.0)
        assert verdicts[1].tokens == Quota(100, 40, 105.0)
        # 2 fades to 1 half-way into the next window
        assert verdicts[2].retry_after == 75.0
        window = int(START // 60)
        assert verdicts[0].window == window
        keys = await inspect(redis_server, "KEYS", "headcount:limits:*")
        assert isinstance(keys, list)
        assert sorted(keys) == [
            f"headcount:limits:{{chat}}:r:{window}".encode(),
            f"headcount:limits:{{chat}}:t:{window}".encode(),
        ]
        ttl = await inspect(redis_server, "TTL", f"headcount:limits:{{chat}}:t:{window}")
        assert isinstance(ttl, int) and TTL - 5 <= ttl <= TTL
        assert store.health == StoreHealth(redis_server.url, True, None, 0)
    finally:
        await store.close()


async def test_windows_are_reckoned_by_the_clock_of_redis(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, 1.0)
    try:
        verdict = await store.take(charge(2))
        assert abs(verdict.window - time.time() // 60) <= 1  # minutes since 1970
    finally:
        await store.close()


async def test_settle_gives_back_what_the_engine_did_not_use(redis_server: RedisServer) -> None:
    clock = FakeClock(START)
    store = RedisStore(redis_server.url, 1.0, clock=clock)
    try:
        reserved = await store.take(charge(0, 1000, 900))
        assert (await store.take(charge(0, 1000, 200))).reason == "tokens_per_minute"
        store.settle("t", reserved.window, -300)
        await store.drain()
        after = await store.take(charge(0, 1000, 200))
        assert after.allowed and after.tokens is not None and after.tokens.remaining == 200
        clock.advance(2 * 60)
        store.settle("t", reserved.window, 10**6)  # that window no longer counts
        await store.drain()
        assert (await store.take(charge(0, 1000, 1000))).allowed
        assert store.settle_failures == 0
    finally:
        await store.close()


async def test_the_same_verdicts_as_the_in_process_store(redis_server: RedisServer) -> None:
    """The Lua script and window.py, charged alike on one stepped clock, agree to the bit."""
    clock = FakeClock(START)
    memory, redis = MemoryStore(clock), RedisStore(redis_server.url, 2.0, clock=clock)
    draw = random.Random(18)
    taken: list[tuple[str, int]] = []
    reasons: set[str] = set()
    try:
        for _ in range(400):
            action = draw.random()
            if action < 0.7:
                asked = Charge(
                    draw.choice(["a", "b"]),
                    draw.choice([0, 4, 20]),
                    draw.choice([0, 100, 1000]),
                    draw.choice([0, 1, 50, 100, 250, 1001]),
                )
                expected, got = memory.take(asked), await redis.take(asked)
                assert got == expected, (asked, clock.now)
                reasons.add(got.reason)
                if got.allowed:
                    taken.append((asked.tenant, got.window))
            elif action < 0.85 and taken:
                tenant, window = draw.choice(taken)
                tokens = draw.randint(-200, 200)
                memory.settle(tenant, window, tokens)
                redis.settle(tenant, window, tokens)
                await redis.drain()
            else:
                clock.advance(draw.uniform(0, 40))
        assert reasons == {"", "requests_per_minute", "tokens_per_minute", "tokens_over_limit"}
        assert redis.health.fail_open == 0 and redis.settle_failures == 0
    finally:
        await redis.close()


async def test_a_restarted_redis_is_sent_the_script_again(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, 1.0)
    try:
        assert (await store.take(charge(3))).allowed
        assert await inspect(redis_server, "SCRIPT", "FLUSH") == b"OK"
        second = await store.take(charge(3))
        assert second.requests is not None and second.requests.remaining == 1
        assert store.health.ok and store.health.fail_open == 0
    finally:
        await store.close()


async def test_the_database_in_the_url_is_the_one_used(redis_server: RedisServer) -> None:
    store = RedisStore(f"{redis_server.url}/3", 1.0)
    try:
        assert (await store.take(charge(3))).allowed
        assert await inspect(redis_server, "DBSIZE") == 0
        assert await inspect(redis_server, "SELECT", "3") == b"OK"
    finally:
        await store.close()
    client = RespClient("127.0.0.1", redis_server.port, db=3, timeout=5.0)
    try:
        assert await client.call("DBSIZE") == 2
    finally:
        await client.close()


async def test_two_replicas_hold_one_limit_between_them(redis_server: RedisServer) -> None:
    replicas = [RedisStore(redis_server.url, 2.0) for _ in range(2)]
    try:
        for replica in replicas:  # connected before the burst, so the two interleave
            assert (await replica.take(charge(1, tenant="warm-up"))).requests is not None
        asked = charge(200, tenant="shared")
        verdicts = await asyncio.gather(*(replicas[i % 2].take(asked) for i in range(600)))
        allowed = sum(v.allowed for v in verdicts)
        assert 190 <= allowed <= 210, allowed
        assert all(r.health.fail_open == 0 for r in replicas)
        by_replica = [sum(v.allowed for v in verdicts[i::2]) for i in range(2)]
        assert all(count > 0 for count in by_replica), by_replica
    finally:
        for replica in replicas:
            await replica.close()


async def test_redis_stopped_mid_run_admits_then_recovers(redis_server: RedisServer) -> None:
    timeout = 0.1
    store = RedisStore(redis_server.url, timeout)
    refused = f"{redis_server.url}: connection refused"
    verdicts: list[Verdict] = []
    done = asyncio.Event()

    async def load() -> None:
        for _ in range(4000):
            if done.is_set():
                return
            verdicts.append(await asyncio.wait_for(store.take(charge(10**6)), timeout + MARGIN))
            await asyncio.sleep(0.005)  # pacing: a load, not a flood

    running = asyncio.create_task(load())
    try:
        await wait_until(lambda: len(verdicts) >= 5, what="takes judged by Redis")
        assert all(v.requests is not None for v in verdicts)
        await redis_server.stop()
        await wait_until(lambda: store.health.reason == refused, what="the refusal in health")
        assert not store.health.ok and store.health.fail_open > 0
        assert verdicts[-1] == UNJUDGED
        await redis_server.start()
        await wait_until(
            lambda: store.health.ok and verdicts[-1].requests is not None,
            timeout=10.0,
            what="judged again",
        )
        assert store.health.reason is None
    finally:
        done.set()
        await running  # a take that hung past its bound raised TimeoutError here
        await store.close()
    assert all(v.allowed for v in verdicts)


async def test_a_redis_that_never_answers_is_given_up_after_the_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    store = RedisStore(url, 0.1)
    try:
        started = time.monotonic()
        verdict = await asyncio.wait_for(store.take(charge(5)), 0.1 + MARGIN)
        assert time.monotonic() - started >= 0.09
        assert verdict == UNJUDGED
        assert store.health == StoreHealth(url, False, f"{url}: no answer within 100ms", 1)
        store.settle("t", verdict.window, 10)  # counted nowhere: nothing to send
        store.settle("t", 123, 10)
        await store.drain()
        assert store.settle_failures == 1  # backing off: failed at once
    finally:
        await store.close()
        server.close()
        await server.wait_closed()


async def test_a_refused_connection_is_named_and_admitted() -> None:
    url = f"redis://127.0.0.1:{free_port()}"
    store = RedisStore(url, 0.1)
    try:
        assert await asyncio.wait_for(store.take(charge(5)), 0.1 + MARGIN) == UNJUDGED
        assert store.health == StoreHealth(url, False, f"{url}: connection refused", 1)
    finally:
        await store.close()
