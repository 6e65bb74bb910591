"""Health that tells the truth, through real routers: stale discovery, no sync yet, gRPC, wedges.

A scheduler's gRPC health once answered SERVING for 39 hours while its
discovery watch was dead; a router's /health stayed green while it routed to
a pod that no longer existed. These scenarios run `headcount serve` as a real
process in k8s-pods mode against the API server emulator and one simulated
engine pod, blind the router, and read its HTTP and gRPC health. A wedged or
dead discovery loop cannot be caused from outside a process, so those run a
`Router` in-process with a fake discovery source.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headcount.app import Router
from headcount.config import (
    DiscoveryMode,
    DiscoverySettings,
    HealthSettings,
    ProbeSettings,
    ServerSettings,
    Settings,
)
from headcount.discovery.build import reflector_timing
from headcount.discovery.listwatch import KubeObject, WatchEvent
from headcount.discovery.pods import PodSource
from headcount.discovery.source import DiscoverySource, SourceStatus
from headcount.fleet import Fleet
from headcount.sim.cluster import (
    RouterClient,
    RouterFlags,
    RouterProcess,
    SimCluster,
    Timings,
    sim_cluster,
)
from headcount.sim.loopback import free_port
from headcount.surfaces.health_watch import EVERY
from tests.support import wait_until

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

NAMESPACE = "default"
MODEL = "sim-model"
ENGINE_IP = "127.0.0.2"
STALE_AFTER = 2.0
DEAD_AFTER = 3.0
"""Shorter than the blind period, so a liveness that followed API errors would fail."""
TIMINGS = Timings(
    probe_interval=0.5,
    watch_idle_timeout=1,
    api_request_timeout=1,
    api_connect_timeout=0.5,
    backoff_initial=0.1,
    backoff_max=0.5,
    discovery_stale_after=STALE_AFTER,
    discovery_dead_after=DEAD_AFTER,
    drain_delay=0,
    drain_timeout=1,
)
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=3)
GRPC_TIMEOUT = 3.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


# ------------------------------------------------------------------ a one-pod cluster


@contextlib.asynccontextmanager
async def one_pod_cluster(tmp_path: Path) -> AsyncIterator[SimCluster]:
    """The emulator with one ready engine pod whose simulated engine listens on its pod IP."""
    cluster = sim_cluster(tmp_path, [ENGINE_IP], namespace=NAMESPACE, bookmark_interval=0.3)
    async with cluster as one_pod:
        await one_pod.add_engine("engine-0", ENGINE_IP, model=MODEL)
        yield one_pod


def k8s_router(cluster: SimCluster) -> RouterFlags:
    return cluster.router_flags(TIMINGS)


async def health_status(router: RouterProcess) -> str:
    status: str = (await router.client.health())["status"]
    return status


async def has_status(router: RouterProcess, wanted: str) -> bool:
    return await health_status(router) == wanted


# ------------------------------------------------------------------ stale discovery


async def test_an_unreachable_api_server_is_a_reason_at_once_and_status_changes_are_logged(
    tmp_path: Path,
) -> None:
    stale_after = 6.0  # room for the reason to show while the status is still ok
    timings = replace(TIMINGS, discovery_stale_after=stale_after)
    async with (
        one_pod_cluster(tmp_path) as cluster,
        RouterProcess(cluster.router_flags(timings)) as router,
    ):
        await wait_until(lambda: has_status(router, "ok"), timeout=10, what="synced and probed")
        await cluster.api.refuse()

        async def unreachable_said() -> bool:
            body = await router.client.health()
            said = any(
                reason.startswith("API server unreachable since ")
                and reason.endswith("; routing on the last known fleet")
                for reason in body["reasons"]
            )
            assert not said or body["status"] == "ok", "the status policy stays as it was"
            return said

        await wait_until(unreachable_said, timeout=stale_after, what="the cause in reasons")
        await wait_until(
            lambda: "/health degraded (was ok)" in router.log_path.read_text(),
            timeout=stale_after + 2 * EVERY + 5,
            what="the change to degraded logged",
        )
        log = router.log_path.read_text().split("/health degraded (was ok)")[1].splitlines()[0]
        assert log.startswith(": API server unreachable since ")
        assert log.endswith("; routing on the last known fleet; discovery stale: k8s-pods")
        await cluster.api.restore()
        await wait_until(
            lambda: "/health ok (was degraded)" in router.log_path.read_text(),
            timeout=10,
            what="the way back logged",
        )


async def test_a_503_for_an_empty_fleet_says_why_as_health_does(tmp_path: Path) -> None:
    async with one_pod_cluster(tmp_path) as cluster:
        await cluster.api.refuse()
        async with RouterProcess(k8s_router(cluster)) as router:

            async def says(why: str) -> bool:
                status, body = await router.client.chat(MODEL)
                assert status == 503, body
                return bool(body["error"]["message"].endswith(why))

            await wait_until(
                lambda: says(": first sync not done: API server unreachable"),
                timeout=2 * EVERY + 5,
                what="the 503 says the API server is unreachable",
            )
            logged = [
                line
                for line in router.log_path.read_text().splitlines()
                if "headcount.access" in line and "status=503" in line
            ]
            assert logged and all(f"model={MODEL} " in line for line in logged), logged
        await cluster.api.restore()
        typo = replace(k8s_router(cluster), label_selector="app=vlm")
        async with RouterProcess(typo) as router:
            await wait_until(
                lambda: says(": no pods match selector app=vlm in namespace default"),
                timeout=2 * EVERY + 5,
                what="the 503 names the selector that matches nothing",
            )


async def test_blind_router_turns_degraded_in_bound_stays_live_and_recovers(
    tmp_path: Path,
) -> None:
    async with (
        one_pod_cluster(tmp_path) as cluster,
        RouterProcess(k8s_router(cluster)) as router,
        RouterProcess(replace(k8s_router(cluster), ready_requires_fresh=True)) as strict,
    ):
        api, client = cluster.api, router.client
        for each in (router, strict):
            await wait_until(
                functools.partial(has_status, each, "ok"), timeout=10, what="synced and probed"
            )
        assert await client.status_of("/readyz") == 200
        assert await strict.client.status_of("/readyz") == 200

        await api.blackhole()
        blinded = time.monotonic()
        # The wait outlasts the bound, so the bound is checked on when degraded was first seen.
        await wait_until(
            lambda: has_status(router, "degraded"),
            timeout=STALE_AFTER + 10,
            interval=0.05,
            what="/health degraded after the API went silent",
        )
        degraded_after = time.monotonic() - blinded
        assert degraded_after <= STALE_AFTER + 2, f"degraded {degraded_after:.2f}s after blinding"
        await wait_until(
            lambda: has_status(strict, "degraded"), timeout=2, what="strict router degraded"
        )

        # Blind for longer than --discovery-dead-after: API errors alone never fail liveness,
        # and a routable engine keeps the lenient router ready.
        deadline = time.monotonic() + DEAD_AFTER + 1
        polls = 0
        while time.monotonic() < deadline and polls < 200:
            polls += 1
            assert await client.status_of("/livez") == 200, await client.get("/livez?verbose")
            assert await strict.client.status_of("/livez") == 200
            assert await client.status_of("/readyz") == 200
            assert await strict.client.status_of("/readyz") == 503
            assert await health_status(router) == "degraded"
            await asyncio.sleep(0.1)
        assert polls >= 5

        status, text = await strict.client.get("/readyz?verbose")
        assert status == 503
        assert "[-]fresh failed: discovery stale: k8s-pods" in text
        assert "[+]synced ok" in text
        assert await strict.client.status_of("/readyz/fresh") == 503
        assert await strict.client.status_of("/readyz/synced") == 200
        for each in (router, strict):
            body = await each.client.health()
            stale, unreachable = sorted(body["reasons"], key=lambda r: r.startswith("API"))
            assert stale == "discovery stale: k8s-pods", "said once, even when strict"
            assert unreachable.startswith("API server unreachable since ")
            assert body["sources"][0]["last_error"]

        await api.restore()
        for each in (router, strict):
            await wait_until(
                functools.partial(has_status, each, "ok"), timeout=5, what="ok after restore"
            )
        assert await strict.client.status_of("/readyz") == 200
        assert await client.status_of("/readyz") == 200


async def test_health_is_unavailable_until_the_first_sync(tmp_path: Path) -> None:
    async with one_pod_cluster(tmp_path) as cluster:
        await cluster.api.refuse()
        async with RouterProcess(k8s_router(cluster)) as router:
            client = router.client
            unreachable = "first sync not done: k8s-pods (API server unreachable)"

            async def cause_said() -> bool:
                # before the first LIST has failed, there is no cause to tell yet
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
                    async with session.get(router.url + "/health") as response:
                        assert response.status == 503
                        body = await response.json()
                assert body["status"] == "unavailable"
                return unreachable in body["reasons"]

            await wait_until(cause_said, timeout=10, what="the cause in /health's reasons")
            assert await client.status_of("/readyz") == 503
            assert await client.get("/readyz?verbose") == (
                503,
                "[-]synced failed: first sync not done: k8s-pods (API server unreachable)\n"
                "[+]shutdown ok\n"
                "readyz check failed\n",
            )
            assert await client.status_of("/livez") == 200

            await cluster.api.restore()
            await wait_until(
                lambda: has_status(router, "ok"), timeout=10, what="ok once the API answers"
            )
            assert await client.status_of("/health") == 200
            assert await client.status_of("/readyz") == 200


# ------------------------------------------------------------------ gRPC health


async def grpc_check(stub: Any, service: str) -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    response = await stub.Check(request, timeout=GRPC_TIMEOUT)
    status: int = response.status
    return status


async def test_grpc_readiness_fails_on_sigterm_while_liveness_serves(tmp_path: Path) -> None:
    grpc_port = free_port()
    async with one_pod_cluster(tmp_path) as cluster:
        flags = replace(
            k8s_router(cluster),
            grpc_health_port=grpc_port,
            timings=replace(TIMINGS, drain_delay=1.5),
        )
        async with RouterProcess(flags) as router:
            assert router.process is not None
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)

                async def ready_serving() -> bool:
                    return bool(await grpc_check(stub, "readiness") == SERVING)

                await wait_until(ready_serving, timeout=10, what="gRPC readiness SERVING")
                assert await grpc_check(stub, "liveness") == SERVING
                assert await grpc_check(stub, "") == SERVING

                router.process.send_signal(signal.SIGTERM)
                signalled = time.monotonic()

                async def ready_not_serving() -> bool:
                    return bool(await grpc_check(stub, "readiness") == NOT_SERVING)

                await wait_until(ready_not_serving, timeout=1, what="readiness NOT_SERVING")
                assert await grpc_check(stub, "") == NOT_SERVING
                assert await grpc_check(stub, "liveness") == SERVING
                assert time.monotonic() - signalled < 1.5, "checked after the drain delay"
            assert await asyncio.wait_for(router.process.wait(), 10) == 0


# ------------------------------------------------------------------ wedged or dead discovery


class WedgedSource:
    """Syncs once, then waits forever on something that never comes: no attempt ever ends."""

    def __init__(self) -> None:
        self.status = SourceStatus(name="wedged", kind="k8s-pods")

    async def run(self) -> None:
        now = time.monotonic()
        self.status.synced = True
        self.status.last_list_success = now
        self.status.last_attempt_finished = now
        await asyncio.Event().wait()


class CrashingSource:
    """Syncs, then dies of a bug."""

    def __init__(self) -> None:
        self.status = SourceStatus(name="crashing", kind="k8s-pods")

    async def run(self) -> None:
        now = time.monotonic()
        self.status.synced = True
        self.status.last_list_success = now
        self.status.last_attempt_finished = now
        await asyncio.sleep(0)
        raise RuntimeError("watch decoder bug")


class WatchWithoutTimeout:
    """A `ListerWatcher` whose LIST works and whose WATCH hangs on connect, with no timeout."""

    async def list(self, label_selector: str) -> tuple[list[KubeObject], str]:
        return [], "1"

    @contextlib.asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_seconds: int, label_selector: str
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        await asyncio.Event().wait()
        yield self._nothing()

    async def _nothing(self) -> AsyncIterator[WatchEvent]:
        return
        yield

    async def reachable(self) -> bool:
        return True


@contextlib.asynccontextmanager
async def in_process_router(
    source: DiscoverySource, *, dead_after: float
) -> AsyncIterator[RouterClient]:
    """A `Router` on a free port with `source` as its only discovery; yields a client for it.

    Its discovery bounds are short, so that a `dead_after` of seconds passes the settings' check.
    """
    port = free_port()
    settings = Settings(
        server=ServerSettings(host="127.0.0.1", port=port),
        probe=ProbeSettings(interval=30),
        discovery=DiscoverySettings(
            mode=DiscoveryMode.K8S_PODS,
            backoff_max=0.5,
            watch_idle_timeout=0.5,
            request_timeout=0.5,
        ),
        health=HealthSettings(
            discovery_dead_after=dead_after,
            discovery_stale_after=3600,
            drain_delay=0,
            drain_timeout=1,
        ),
    )
    router = Router(settings, Fleet(unhealthy_after=settings.probe.unhealthy_after), [source])
    stop = asyncio.Event()
    task = asyncio.create_task(router.run(stop))
    client = RouterClient(f"http://127.0.0.1:{port}")
    try:
        await wait_until(lambda: client.get("/readyz"), timeout=5, what="router listening")
        yield client
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_wedged_discovery_loop_fails_liveness_within_the_bound() -> None:
    dead_after = 1.5
    async with in_process_router(WedgedSource(), dead_after=dead_after) as client:
        assert await client.status_of("/livez") == 200
        started = time.monotonic()

        async def dead() -> bool:
            return await client.status_of("/livez") == 503

        # The wait outlasts the bound, so the bound is checked on when 503 was first seen.
        await wait_until(
            dead, timeout=dead_after + 10, interval=0.05, what="/livez 503 on a wedged loop"
        )
        dead_for = time.monotonic() - started
        assert dead_for <= dead_after + 2, f"/livez failed {dead_for:.2f}s after it answered 200"
        status, text = await client.get("/livez?verbose")
        assert status == 503
        assert "[-]discovery:wedged failed: discovery loop wedged made no progress" in text
        assert f"(bound {dead_after:g}s)" in text
        assert await client.get("/readyz") == (200, "ok\n")


async def test_a_real_reflector_hung_on_a_call_without_timeout_fails_liveness() -> None:
    dead_after = 1.5
    settings = DiscoverySettings(mode=DiscoveryMode.K8S_PODS)
    source = PodSource(
        Fleet(unhealthy_after=ProbeSettings().unhealthy_after),
        WatchWithoutTimeout(),
        engine_port=settings.engine_port,
        namespace="default",
        label_selector=settings.label_selector,
        timing=reflector_timing(settings),
        name="hung",
    )
    async with in_process_router(source, dead_after=dead_after) as client:

        async def dead() -> bool:
            return await client.status_of("/livez") == 503

        await wait_until(dead, timeout=dead_after + 2, what="/livez 503 on a hung reflector")
        status, text = await client.get("/livez?verbose")
        assert status == 503
        assert "[-]discovery:hung failed: discovery loop hung made no progress" in text
        assert await client.get("/readyz") == (200, "ok\n")


async def test_a_crashed_discovery_loop_fails_liveness_at_once_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="headcount.app")
    async with in_process_router(CrashingSource(), dead_after=3600) as client:
        await wait_until(lambda: caplog.records, timeout=2, what="the error log line")
        status, text = await client.get("/livez?verbose")
        assert status == 503
        assert "[-]discovery:crashing failed: discovery loop crashing has stopped" in text
    (record,) = [r for r in caplog.records if r.name == "headcount.app"]
    message = record.getMessage()
    assert record.levelno == logging.ERROR
    assert "crashing stopped" in message
    assert "RuntimeError('watch decoder bug')" in message
    assert "/livez now fails" in message
    assert record.exc_info is not None
