"""`/health` and `/engines` explain an empty or odd fleet; a static list never looks stale.

Discovery runs for real (kubeconfig, kubernetes_asyncio, the API server emulator
on loopback) and `AdminApp` answers from its status and fleet, so each test sees
what an operator sees: a wrong namespace, a selector typo and an empty fleet
read apart, and pods that match but are not engines are listed with the reason
without ever entering the fleet. No prober runs: an engine stays `pending`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headcount._http.local import LocalRequest
from headcount.config import DiscoveryMode, DiscoverySettings, HealthSettings, ProbeSettings
from headcount.discovery.build import build_k8s_source
from headcount.discovery.source import DiscoverySource
from headcount.discovery.static import StaticSource
from headcount.fleet import Fleet
from headcount.sim.apiserver import (
    ApiServerSim,
    ApiServerSimConfig,
    make_pod,
    make_service,
    running_apiserver,
)
from headcount.surfaces.admin import AdminApp
from headcount.surfaces.metrics import Metrics
from tests.support import wait_until

__all__: list[str] = []

ENGINE = {"app": "vllm", "model": "llama"}


@pytest.fixture
async def api() -> AsyncIterator[ApiServerSim]:
    async with running_apiserver(ApiServerSimConfig(bookmark_interval=0.5)) as sim:
        yield sim


class View:
    """What an operator reads from the router: `/health` and `/engines`."""

    def __init__(self, admin: AdminApp, fleet: Fleet, source: DiscoverySource) -> None:
        self.admin = admin
        self.fleet = fleet
        self.source = source

    async def get(self, path: str) -> tuple[int, Any]:
        response = await self.admin.handle(LocalRequest("GET", path, "", {}, b""))
        return response.status, json.loads(response.body)

    async def health(self) -> tuple[int, Any]:
        return await self.get("/health")

    async def reasons(self) -> list[str]:
        """`/health`'s reasons."""
        _, body = await self.health()
        reasons: list[str] = body["reasons"]
        return reasons

    async def not_engines(self) -> dict[str, str]:
        """`/engines`' `not_engines`: name -> reason (each with state `not_an_engine`)."""
        _, body = await self.get("/engines")
        assert {entry["state"] for entry in body["not_engines"]} <= {"not_an_engine"}
        return {entry["name"]: entry["reason"] for entry in body["not_engines"]}


def admin_over(fleet: Fleet, source: DiscoverySource) -> AdminApp:
    return AdminApp(
        fleet,
        Metrics(lambda: fleet.snapshot, [source.status]),
        [source.status],
        HealthSettings(),
        dead_sources=frozenset,
        shutting_down=lambda: False,
    )


@asynccontextmanager
async def router_view(
    api: ApiServerSim,
    tmp_path: Path,
    *,
    namespace: str = "llm",
    selector: str = "app=vllm",
    mode: DiscoveryMode = DiscoveryMode.K8S_PODS,
) -> AsyncIterator[View]:
    """Discovery as `serve` builds it, synced, and the admin endpoints over it."""
    settings = DiscoverySettings(
        mode=mode,
        kubeconfig=api.kubeconfig(tmp_path / "kubeconfig"),
        namespace=namespace,
        label_selector=selector,
        backoff_initial=0.05,
        backoff_max=0.5,
    )
    fleet = Fleet(unhealthy_after=ProbeSettings().unhealthy_after)
    source = await build_k8s_source(settings, fleet)
    task = asyncio.ensure_future(source.run())
    try:
        await wait_until(lambda: source.status.watch_connected, what="sync and watch")
        yield View(admin_over(fleet, source), fleet, source)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize(
    ("namespace", "selector"),
    [("default", "app=vllm"), ("llm", "app=vlm")],
    ids=["wrong namespace", "selector typo"],
)
async def test_a_wrong_namespace_or_selector_is_named_in_the_health_reason(
    api: ApiServerSim, tmp_path: Path, namespace: str, selector: str
) -> None:
    api.apply_pod(make_pod("engine-0", namespace="llm", labels=ENGINE, ip="10.0.0.1"))
    async with router_view(api, tmp_path, namespace=namespace, selector=selector) as view:
        status, body = await view.health()
        assert status == 503
        assert (
            f"no routable engine: no pods match selector {selector} in namespace {namespace}"
            in body["reasons"]
        )
        (source,) = body["sources"]
        assert source["watches"] == {
            "resources": ["pods"],
            "namespace": namespace,
            "label_selector": selector,
        }
        assert (source["objects"], source["engines"], source["not_engines"]) == (0, 0, {})


async def test_an_empty_fleet_says_nothing_matches_until_an_engine_comes(
    api: ApiServerSim, tmp_path: Path
) -> None:
    async with router_view(api, tmp_path) as view:
        assert await view.reasons() == [
            "no routable engine: no pods match selector app=vllm in namespace llm"
        ]
        api.apply_pod(make_pod("engine-0", namespace="llm", labels=ENGINE, ip="10.0.0.1"))
        await wait_until(lambda: len(view.fleet.snapshot.engines) == 1, what="the new engine")
        assert await view.reasons() == [
            "no routable engine: 1 pod matches selector app=vllm in namespace llm: "
            "1 engine, none routable (1 pending)"
        ]


async def test_pods_that_match_but_are_not_engines_are_counted_by_reason_and_listed(
    api: ApiServerSim, tmp_path: Path
) -> None:
    for name in ("warming-0", "warming-1"):
        api.apply_pod(make_pod(name, namespace="llm", labels=ENGINE, ip="10.0.0.1", ready=False))
    api.apply_pod(
        make_pod("queued", namespace="llm", labels=ENGINE, ip=None, ready=False, phase="Pending")
    )
    async with router_view(api, tmp_path) as view:
        status, body = await view.health()
        assert status == 503
        assert body["reasons"] == [
            "no routable engine: 3 pods match selector app=vllm in namespace llm "
            "but none is an engine: 2 not ready, 1 pending"
        ]
        assert body["sources"][0]["not_engines"] == {"not ready": 2, "pending": 1}
        assert await view.not_engines() == {
            "llm/queued": "pending",
            "llm/warming-0": "not ready",
            "llm/warming-1": "not ready",
        }
        assert view.fleet.snapshot.engines == (), "never in the fleet: never probed nor routed"


async def test_watch_events_move_a_pod_between_not_an_engine_and_engine(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_pod(make_pod("warming", namespace="llm", labels=ENGINE, ip="10.0.0.1", ready=False))
    api.apply_pod(make_pod("doomed", namespace="llm", labels=ENGINE, ip="10.0.0.2", ready=False))
    async with router_view(api, tmp_path) as view:
        assert set(await view.not_engines()) == {"llm/warming", "llm/doomed"}
        api.apply_pod(make_pod("warming", namespace="llm", labels=ENGINE, ip="10.0.0.1"))
        api.delete_pod("llm", "doomed")
        await wait_until(lambda: not view.source.status.not_engines, what="both events applied")
        assert [e.spec.name for e in view.fleet.snapshot.engines] == ["llm/warming"]
        api.delete_pod("llm", "warming", graceful=True)
        await wait_until(lambda: not view.fleet.snapshot.engines, what="terminating: out")
        assert await view.not_engines() == {"llm/warming": "terminating"}
        assert await view.reasons() == [
            "no routable engine: 1 pod matches selector app=vllm in namespace llm "
            "but none is an engine: 1 terminating"
        ]


async def test_engines_and_not_engines_are_both_explained(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_pod(make_pod("engine", namespace="llm", labels=ENGINE, ip="10.0.0.1"))
    api.apply_pod(make_pod("warming", namespace="llm", labels=ENGINE, ip="10.0.0.2", ready=False))
    async with router_view(api, tmp_path) as view:
        _, body = await view.health()
        assert body["reasons"] == [
            "no routable engine: 2 pods match selector app=vllm in namespace llm: "
            "1 engine, none routable (1 pending); 1 not an engine (1 not ready)"
        ]
        assert (body["sources"][0]["objects"], body["sources"][0]["engines"]) == (2, 1)


async def test_a_service_that_cannot_be_an_engine_is_listed_with_why(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_service(make_service("headless", namespace="llm", labels=ENGINE, cluster_ip="None"))
    async with router_view(api, tmp_path, mode=DiscoveryMode.K8S_SERVICES) as view:
        assert await view.not_engines() == {"llm/headless": "headless"}
        _, body = await view.health()
        assert body["sources"][0]["watches"]["resources"] == ["services", "endpointslices"]
        assert body["reasons"] == [
            "no routable engine: 1 service matches selector app=vllm in namespace llm "
            "but none is an engine: 1 headless"
        ]


async def test_static_backends_that_fail_are_explained_as_engines_by_state() -> None:
    fleet = Fleet(unhealthy_after=ProbeSettings().unhealthy_after)
    source = StaticSource(fleet, ["http://127.0.0.1:1", "http://127.0.0.1:2"])
    task = asyncio.ensure_future(source.run())
    try:
        await wait_until(lambda: source.status.synced, what="the static list")
        _, body = await View(admin_over(fleet, source), fleet, source).health()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert body["reasons"] == [
        "no routable engine: 2 backends match: 2 engines, none routable (2 pending)"
    ]


def last_sync(text: str) -> dict[str, float]:
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "headcount_discovery_last_sync_timestamp_seconds"
    ]
    return {sample.labels["source"]: sample.value for sample in family.samples}


async def test_a_static_source_is_in_sync_at_every_scrape() -> None:
    fleet = Fleet(unhealthy_after=ProbeSettings().unhealthy_after)
    source = StaticSource(fleet, ["http://127.0.0.1:1"], wall_clock=lambda: 1_000.0)
    wall = [1_000.0]
    metrics = Metrics(lambda: fleet.snapshot, [source.status], wall_clock=lambda: wall[0])
    assert last_sync((await metrics.render()).decode()) == {}, "nothing before the list is applied"
    task = asyncio.ensure_future(source.run())
    try:
        await wait_until(lambda: source.status.synced, what="the static list")
        wall[0] = 1_000.0 + 86_400
        assert last_sync((await metrics.render()).decode()) == {"static": 1_000.0 + 86_400}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
