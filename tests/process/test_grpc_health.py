"""The gRPC health service, probed by a real grpc.aio client over loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import uvloop
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headcount.surfaces.grpc_health import GrpcHealthServer
from headcount.surfaces.health import Check, HealthReport, Status

__all__: list[str] = []

pytestmark = pytest.mark.timeout(30)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
CALL_TIMEOUT = 5.0
WATCH_TIMEOUT = 20.0


class FakeHealth:
    """A `report` callable whose liveness and readiness the test flips."""

    def __init__(self, *, live: bool = True, ready: bool = True) -> None:
        self.live = live
        self.ready = ready
        self.broken = False

    def __call__(self) -> HealthReport:
        if self.broken:
            raise RuntimeError("report bug")
        live = (Check("discovery:static", self.live, "" if self.live else "wedged"),)
        ready = (Check("synced", self.ready, "" if self.ready else "first sync not done"),)
        status = Status.OK if self.live and self.ready else Status.UNAVAILABLE
        return HealthReport(status, live, ready, {})


@contextlib.asynccontextmanager
async def running(
    report: FakeHealth, *, refresh_interval: float = 0.05
) -> AsyncIterator[tuple[Any, GrpcHealthServer]]:
    server = GrpcHealthServer(report, host="127.0.0.1", port=0, refresh_interval=refresh_interval)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield health_pb2_grpc.HealthStub(channel), server
    finally:
        await server.stop(grace=0)


async def check(stub: Any, service: str) -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    response = await stub.Check(request, timeout=CALL_TIMEOUT)
    status: int = response.status
    return status


async def next_status(call: Any) -> int:
    message = await asyncio.wait_for(call.read(), timeout=CALL_TIMEOUT)
    assert message is not grpc.aio.EOF, "watch stream ended"
    status: int = message.status
    return status


def watch(stub: Any, service: str) -> Any:
    return stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=WATCH_TIMEOUT)


async def test_check_answers_liveness_and_readiness_from_the_report() -> None:
    health = FakeHealth(live=True, ready=False)
    async with running(health) as (stub, _):
        assert await check(stub, "liveness") == SERVING
        assert await check(stub, "readiness") == NOT_SERVING
        assert await check(stub, "") == NOT_SERVING

        health.live, health.ready = False, True
        assert await check(stub, "liveness") == NOT_SERVING
        assert await check(stub, "readiness") == SERVING
        assert await check(stub, "") == SERVING


async def test_check_judges_a_fresh_report_without_waiting_for_the_refresh() -> None:
    health = FakeHealth()
    async with running(health, refresh_interval=3600) as (stub, _):
        assert await check(stub, "readiness") == SERVING
        health.ready = False
        assert await check(stub, "readiness") == NOT_SERVING


async def test_check_on_an_unknown_service_is_not_found() -> None:
    async with running(FakeHealth()) as (stub, _):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await check(stub, "engines")
        assert error.value.code() is grpc.StatusCode.NOT_FOUND


async def test_list_reports_every_service() -> None:
    async with running(FakeHealth(live=True, ready=False)) as (stub, _):
        response = await stub.List(health_pb2.HealthListRequest(), timeout=CALL_TIMEOUT)
        statuses = {name: entry.status for name, entry in response.statuses.items()}
        assert statuses == {"": NOT_SERVING, "liveness": SERVING, "readiness": NOT_SERVING}


async def test_watch_follows_readiness_as_it_flips_without_any_call() -> None:
    health = FakeHealth()
    async with running(health) as (stub, _):
        readiness, overall = watch(stub, "readiness"), watch(stub, "")
        assert await next_status(readiness) == SERVING
        assert await next_status(overall) == SERVING

        health.ready = False
        assert await next_status(readiness) == NOT_SERVING
        assert await next_status(overall) == NOT_SERVING

        health.ready = True
        assert await next_status(readiness) == SERVING
        assert await next_status(overall) == SERVING
        readiness.cancel()
        overall.cancel()


async def test_watch_sends_only_changes_of_its_own_service() -> None:
    health = FakeHealth()
    async with running(health) as (stub, _):
        liveness, readiness = watch(stub, "liveness"), watch(stub, "readiness")
        assert await next_status(liveness) == SERVING
        assert await next_status(readiness) == SERVING

        health.ready = False
        assert await next_status(readiness) == NOT_SERVING
        health.live = False
        # A repeated SERVING (from the readiness change) would arrive first.
        assert await next_status(liveness) == NOT_SERVING
        liveness.cancel()
        readiness.cancel()


async def test_watch_on_an_unknown_service_says_service_unknown() -> None:
    async with running(FakeHealth()) as (stub, _):
        call = watch(stub, "engines")
        assert await next_status(call) == SERVICE_UNKNOWN
        assert not call.done()
        call.cancel()


async def test_stop_turns_watchers_not_serving_and_ends_their_streams() -> None:
    health = FakeHealth()
    server = GrpcHealthServer(health, host="127.0.0.1", port=0, refresh_interval=0.05)
    port = await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = watch(health_pb2_grpc.HealthStub(channel), "liveness")
        assert await next_status(call) == SERVING
        await server.stop(grace=CALL_TIMEOUT)
        assert await next_status(call) == NOT_SERVING
        assert await asyncio.wait_for(call.read(), timeout=CALL_TIMEOUT) is grpc.aio.EOF
        assert await call.code() is grpc.StatusCode.OK


async def test_a_failing_report_is_not_serving() -> None:
    health = FakeHealth()
    async with running(health) as (stub, _):
        call = watch(stub, "liveness")
        assert await next_status(call) == SERVING
        health.broken = True
        assert await check(stub, "liveness") == NOT_SERVING
        assert await next_status(call) == NOT_SERVING
        call.cancel()


async def test_a_port_already_in_use_fails_to_start() -> None:
    first = GrpcHealthServer(FakeHealth(), host="127.0.0.1", port=0)
    port = await first.start()
    try:
        second = GrpcHealthServer(FakeHealth(), host="127.0.0.1", port=port)
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            await second.start()
    finally:
        await first.stop(grace=0)


def test_refresh_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="refresh_interval"):
        GrpcHealthServer(FakeHealth(), host="127.0.0.1", port=0, refresh_interval=0)


def test_serves_check_and_watch_on_uvloop() -> None:
    """The router runs on uvloop; the health server must run on the same loop."""

    async def scenario() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        health = FakeHealth()
        async with running(health) as (stub, _):
            assert await check(stub, "") == SERVING
            call = watch(stub, "readiness")
            assert await next_status(call) == SERVING
            health.ready = False
            assert await next_status(call) == NOT_SERVING
            assert await check(stub, "") == NOT_SERVING
            call.cancel()

    uvloop.run(asyncio.wait_for(scenario(), timeout=WATCH_TIMEOUT))
