"""The router's own long-lived tasks under the supervisor, in a running router or server.

The prober is made to crash once and is seen restarted and probing again; the
gRPC health refresher and the key-file watcher are supervised too. The
supervisor's back-off itself, on a fake clock, is tests/unit/test_supervise.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from headcount.app import Router
from headcount.config import (
    AuthSettings,
    DiscoverySettings,
    HealthSettings,
    ProbeSettings,
    ServerSettings,
    Settings,
    SupervisionSettings,
)
from headcount.discovery.static import StaticSource
from headcount.fleet import EngineState, Fleet, Snapshot
from headcount.sim.engine import EngineSimConfig, running_engine
from headcount.supervise import Supervisor
from headcount.surfaces.grpc_health import GrpcHealthServer
from headcount.surfaces.health import HealthReport, Status
from headcount.surfaces.metrics import Metrics
from tests.support import wait_until


def restarts(metrics: Metrics, task: str) -> float | None:
    return metrics.registry.get_sample_value("headcount_task_restarts_total", {"task": task})


def no_fleet() -> Metrics:
    return Metrics(lambda: Snapshot((), 0))


async def test_the_routers_prober_crashes_once_is_restarted_and_probes_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_engine(EngineSimConfig()) as engine:
        settings = Settings(
            server=ServerSettings(host="127.0.0.1", port=0),
            discovery=DiscoverySettings(backends=(engine.url,)),
            probe=ProbeSettings(interval=0.1, unhealthy_after=1),
            health=HealthSettings(drain_delay=0.0, drain_timeout=1.0),
            supervision=SupervisionSettings(restart_delay=0.01),
        )
        fleet = Fleet(unhealthy_after=1)
        router = Router(settings, fleet, [StaticSource(fleet, settings.discovery.backends)])
        real_round = router.prober._probe_round
        crashed = False

        async def crash_once() -> None:
            nonlocal crashed
            if not crashed:
                crashed = True
                raise RuntimeError("prober bug")
            await real_round()

        router.prober._probe_round = crash_once  # type: ignore[method-assign]
        stop = asyncio.Event()
        running = asyncio.create_task(router.run(stop))
        try:
            await wait_until(lambda: restarts(router.metrics, "prober") == 1, what="a restart")
            await engine.set_fail_mode("http-500")
            await wait_until(
                lambda: fleet.snapshot.by_id[engine.url].state is EngineState.UNHEALTHY,
                what="probing again after the restart",
            )
        finally:
            stop.set()
            await asyncio.wait_for(running, 30)
    crashes = [r for r in caplog.records if "task prober stopped" in r.getMessage()]
    assert len(crashes) == 1 and "RuntimeError: prober bug" in crashes[0].getMessage()
    assert crashes[0].exc_info is not None


async def test_the_grpc_health_refresher_is_supervised_too() -> None:
    metrics = no_fleet()
    supervisor = Supervisor(SupervisionSettings(restart_delay=0.01), metrics.task_restarts)
    server = GrpcHealthServer(
        lambda: HealthReport(Status.OK, (), (), {}),
        host="127.0.0.1",
        port=0,
        refresh_interval=0.01,
        supervise=supervisor.run,
    )
    await server.start()
    try:
        servicer = server._health._servicer
        real_refresh = servicer.refresh
        calls = 0

        def refresh_failing_once() -> object:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("refresh bug")
            return real_refresh()

        servicer.refresh = refresh_failing_once  # type: ignore[method-assign,assignment]
        await wait_until(lambda: restarts(metrics, "grpc-health-refresh") == 1)
        await wait_until(lambda: calls > 3, what="refreshing again")
    finally:
        await server.stop(grace=0)


@pytest.mark.parametrize("with_key_file", [True, False])
async def test_the_key_file_watcher_is_supervised_when_there_is_a_key_file(
    tmp_path: Path, with_key_file: bool
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("a-key\n")
    settings = Settings(
        server=ServerSettings(host="127.0.0.1", port=0),
        discovery=DiscoverySettings(backends=("http://127.0.0.1:1",)),
        health=HealthSettings(drain_delay=0.0, drain_timeout=1.0),
        auth=AuthSettings(api_keys_file=keys if with_key_file else None),
    )
    fleet = Fleet(unhealthy_after=1)
    router = Router(settings, fleet, [StaticSource(fleet, settings.discovery.backends)])
    stop = asyncio.Event()
    running = asyncio.create_task(router.run(stop))
    try:
        await wait_until(lambda: restarts(router.metrics, "prober") == 0, what="running")
        # with no key file there is nothing to watch: the watcher returns, and is no crash
        assert restarts(router.metrics, "key-files") == (0 if with_key_file else None)
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
