"""InferencePool discovery end to end: kubernetes_asyncio through kube.py against the emulator.

The pool and its pods are watched with the guarantees of pod discovery: what
changed while the source was blind (the emulator refusing connections,
dropping watches, answering nothing, or compacting its history) is reconciled
by the re-list, whether the pool was edited, deleted, or a pod of it deleted.
A pool that does not exist is named in `/health`'s words until it is created.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from headcount.config import DiscoveryMode, DiscoverySettings, ProbeSettings
from headcount.discovery.build import build_k8s_source, k8s_source, lister_watcher
from headcount.discovery.kubeconfig import load_kube_config
from headcount.discovery.source import DiscoverySource
from headcount.fleet import Fleet
from headcount.sim.apiserver import (
    ApiServerSim,
    ApiServerSimConfig,
    make_inference_pool,
    make_pod,
    running_apiserver,
)
from headcount.sim.cluster import RouterProcess, Timings, hosts, sim_cluster
from headcount.surfaces.health import explain_no_engine
from tests.support import wait_until

POOL = DiscoverySettings(
    mode=DiscoveryMode.INFERENCE_POOL,
    inference_pool="llama",
    watch_idle_timeout=5.0,
    request_timeout=2.0,
    connect_timeout=0.5,
    backoff_initial=0.05,
    backoff_max=0.5,
)
"""The pool `llama`, with timeouts and back-off short enough for test time."""
LLAMA = {"app": "vllm", "model": "llama"}
QWEN = {"app": "vllm", "model": "qwen"}


@pytest.fixture
async def api() -> AsyncIterator[ApiServerSim]:
    async with running_apiserver(ApiServerSimConfig(bookmark_interval=0.5)) as sim:
        yield sim


def apply_pool(
    api: ApiServerSim, labels: dict[str, str] = LLAMA, ports: tuple[int, ...] = (8000,)
) -> None:
    api.apply(make_inference_pool("llama", match_labels=labels, ports=ports))


@asynccontextmanager
async def discovery(
    api: ApiServerSim, tmp_path: Path, settings: DiscoverySettings = POOL
) -> AsyncIterator[tuple[DiscoverySource, Fleet]]:
    """A synced pool source over the emulator's `default` namespace."""
    fleet = Fleet(unhealthy_after=ProbeSettings().unhealthy_after)
    kube = await load_kube_config(api.kubeconfig(tmp_path / "kubeconfig"))
    async with ApiClient(kube.configuration) as client:
        source = k8s_source(
            settings,
            fleet,
            lambda resource: lister_watcher(client, resource, "default", settings),
            "default",
        )
        task = asyncio.ensure_future(source.run())
        try:
            await wait_until(lambda: source.status.watch_connected, what="sync and watch")
            yield source, fleet
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled(), "the discovery loop ended on its own"


def urls(fleet: Fleet) -> dict[str, str]:
    return {engine.spec.name: engine.spec.url for engine in fleet.snapshot.engines}


def has(fleet: Fleet, expected: dict[str, str]) -> Callable[[], bool]:
    return lambda: urls(fleet) == expected


def why_empty(source: DiscoverySource, fleet: Fleet) -> str:
    return explain_no_engine([source.status], fleet.snapshot)


BLIND: dict[str, Callable[[ApiServerSim], Awaitable[None]]] = {
    "refused": lambda api: api.refuse(),
    "blackholed": lambda api: api.blackhole(),
}


async def go_blind(api: ApiServerSim, source: DiscoverySource, how: str) -> None:
    await BLIND[how](api)
    await wait_until(lambda: source.status.last_error, what="the loop noticing")


async def test_engines_appear_once_the_pool_and_its_pods_exist(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_pod(make_pod("llama-0", labels=LLAMA, ip="10.0.0.1"))
    api.apply_pod(make_pod("qwen-0", labels=QWEN, ip="10.0.0.2"))
    async with discovery(api, tmp_path) as (source, fleet):
        assert urls(fleet) == {}
        assert source.status.missing == "inference pool llama not found in namespace default"
        assert why_empty(source, fleet) == (
            "no routable engine: inference pool llama not found in namespace default"
        )
        apply_pool(api, ports=(8000, 8001))
        await wait_until(
            has(
                fleet,
                {
                    "default/llama-0-rank-0": "http://10.0.0.1:8000",
                    "default/llama-0-rank-1": "http://10.0.0.1:8001",
                },
            ),
            what="the pool's pod on both ports",
        )
        assert source.status.missing is None
        api.apply_pod(make_pod("llama-1", labels=LLAMA, ip="10.0.0.3"))
        api.apply_pod(make_pod("llama-0", labels=LLAMA, ip="10.0.0.1", ready=False))
        await wait_until(
            has(
                fleet,
                {
                    "default/llama-1-rank-0": "http://10.0.0.3:8000",
                    "default/llama-1-rank-1": "http://10.0.0.3:8001",
                },
            ),
            what="pod events applied to every port",
        )
        assert source.status.not_engine_counts() == {"not ready": 1}
        assert source.status.relists == {"start": 2}, "events alone, no relist needed"
        assert source.status.watches is not None
        assert source.status.watches.label_selector == "app=vllm,model=llama"


async def test_a_selector_change_moves_the_fleet(api: ApiServerSim, tmp_path: Path) -> None:
    api.apply_pod(make_pod("llama-0", labels=LLAMA, ip="10.0.0.1"))
    api.apply_pod(make_pod("qwen-0", labels=QWEN, ip="10.0.0.2"))
    apply_pool(api)
    async with discovery(api, tmp_path) as (source, fleet):
        assert urls(fleet) == {"default/llama-0-rank-0": "http://10.0.0.1:8000"}
        api.patch(
            "InferencePool", "default", "llama", {"spec": {"selector": {"matchLabels": QWEN}}}
        )
        await wait_until(
            has(fleet, {"default/qwen-0-rank-0": "http://10.0.0.2:8000"}), what="the new selector"
        )
        assert source.status.removed_by_relist == 0, "a pool event, not a missed deletion"


async def test_a_target_ports_change_moves_the_ports(api: ApiServerSim, tmp_path: Path) -> None:
    api.apply_pod(make_pod("llama-0", labels=LLAMA, ip="10.0.0.1"))
    apply_pool(api, ports=(8000, 8001))
    async with discovery(api, tmp_path) as (_, fleet):
        assert len(urls(fleet)) == 2
        ids = {engine.id for engine in fleet.snapshot.engines}
        api.patch(
            "InferencePool", "default", "llama", {"spec": {"targetPorts": [{"number": 9000}]}}
        )
        await wait_until(
            has(fleet, {"default/llama-0-rank-0": "http://10.0.0.1:9000"}), what="the new port"
        )
        assert not ids & {engine.id for engine in fleet.snapshot.engines}, "a new engine"


@pytest.mark.parametrize("how", sorted(BLIND))
async def test_a_pool_deleted_while_blind_empties_the_fleet_on_the_relist(
    api: ApiServerSim, tmp_path: Path, how: str
) -> None:
    api.apply_pod(make_pod("llama-0", labels=LLAMA, ip="10.0.0.1"))
    apply_pool(api)
    settings = replace(POOL, watch_idle_timeout=0.6, request_timeout=0.3)
    async with discovery(api, tmp_path, settings) as (source, fleet):
        assert len(urls(fleet)) == 1
        await go_blind(api, source, how)
        api.delete("InferencePool", "default", "llama")
        assert len(urls(fleet)) == 1, "what we knew stays while we cannot know better"
        await api.restore()
        await wait_until(has(fleet, {}), what="the fleet emptied by the relist")
        assert why_empty(source, fleet) == (
            "no routable engine: inference pool llama not found in namespace default"
        )
        apply_pool(api)
        await wait_until(lambda: len(urls(fleet)) == 1, what="the pool created again")


async def test_a_pool_edited_while_blind_and_compacted_away_is_reconciled(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_pod(make_pod("llama-0", labels=LLAMA, ip="10.0.0.1"))
    api.apply_pod(make_pod("qwen-0", labels=QWEN, ip="10.0.0.2"))
    apply_pool(api)
    async with discovery(api, tmp_path) as (source, fleet):
        await go_blind(api, source, "refused")
        apply_pool(api, labels=QWEN, ports=(8000, 8002))
        api.compact()
        await api.restore()
        await wait_until(
            has(
                fleet,
                {
                    "default/qwen-0-rank-0": "http://10.0.0.2:8000",
                    "default/qwen-0-rank-1": "http://10.0.0.2:8002",
                },
            ),
            what="the edited pool",
        )


@pytest.mark.parametrize("reset", [False, True])
async def test_a_pool_edited_after_its_watch_dropped_is_reconciled(
    api: ApiServerSim, tmp_path: Path, reset: bool
) -> None:
    api.apply_pod(make_pod("llama-0", labels=LLAMA, ip="10.0.0.1"))
    apply_pool(api)
    async with discovery(api, tmp_path) as (source, fleet):
        await wait_until(lambda: api.open_watches == 2, what="both watches")
        await api.drop_watches(reset=reset)
        apply_pool(api, ports=(8001,))
        await wait_until(
            has(fleet, {"default/llama-0-rank-0": "http://10.0.0.1:8001"}), what="the new port"
        )
        await wait_until(lambda: sum(source.status.relists.values()) >= 4, what="both relisted")


@pytest.mark.parametrize("how", sorted(BLIND))
async def test_a_pod_deleted_while_blind_is_gone_after_the_relist(
    api: ApiServerSim, tmp_path: Path, how: str
) -> None:
    api.apply_pod(make_pod("stays", labels=LLAMA, ip="10.0.0.1"))
    api.apply_pod(make_pod("deleted-while-blind", labels=LLAMA, ip="10.0.0.2"))
    apply_pool(api, ports=(8000, 8001))
    settings = replace(POOL, watch_idle_timeout=0.6, request_timeout=0.3)
    async with discovery(api, tmp_path, settings) as (source, fleet):
        assert len(urls(fleet)) == 4
        await go_blind(api, source, how)
        api.delete_pod("default", "deleted-while-blind")
        await api.restore()
        await wait_until(
            lambda: {name.rsplit("-rank-", 1)[0] for name in urls(fleet)} == {"default/stays"},
            what="the ghost gone",
        )
        assert source.status.removed_by_relist == 2, "both of its ports"
        await wait_until(lambda: source.status.last_error is None, what="recovery")


async def test_build_k8s_source_builds_an_inference_pool_source(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_pod(make_pod("llama-0", namespace="llm", labels=LLAMA, ip="10.0.0.1"))
    api.apply(make_inference_pool("llama", namespace="llm", match_labels=LLAMA))
    settings = replace(POOL, kubeconfig=api.kubeconfig(tmp_path / "kubeconfig", namespace="llm"))
    fleet = Fleet(unhealthy_after=ProbeSettings().unhealthy_after)
    source = await build_k8s_source(settings, fleet)
    task = asyncio.ensure_future(source.run())
    try:
        await wait_until(lambda: urls(fleet) == {"llm/llama-0-rank-0": "http://10.0.0.1:8000"})
        assert source.status.kind == "inference-pool"
        watched: Any = source.status.watches
        assert (watched.resource, watched.namespace, watched.also) == (
            "pods",
            "llm",
            ("inferencepools",),
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- the router as a real process ---------------------------------------------------------------

MODEL = "sim-model"
ROUTER_TIMINGS = Timings(probe_interval=0.2, drain_delay=0, backoff_initial=0.05, backoff_max=0.5)
"""Probes and back-off short enough for a test to see recoveries within seconds."""


async def reasons(router: RouterProcess) -> list[str]:
    found: list[str] = (await router.client.health())["reasons"]
    return found


async def ready_engines(router: RouterProcess) -> set[str]:
    engines = await router.client.engines_by_name()
    return {name for name, engine in engines.items() if engine["state"] == "ready"}


async def test_the_router_waits_for_its_pool_then_routes_to_it_and_drops_a_ghost(
    tmp_path: Path,
) -> None:
    stays_ip, goes_ip = hosts("127.0.1", 2)
    async with sim_cluster(tmp_path, [stays_ip, goes_ip], namespace="llm") as cluster:
        await cluster.add_engine("stays", stays_ip, model=MODEL)
        goes = await cluster.add_engine("goes", goes_ip, model=MODEL)
        flags = cluster.pool_router_flags("llama", ROUTER_TIMINGS)
        async with RouterProcess(flags) as router:
            missing = "no routable engine: inference pool llama not found in namespace llm"
            await wait_until(
                lambda: _contains(reasons(router), missing), what="/health naming the pool"
            )
            assert (await router.client.chat(MODEL))[0] == 503
            cluster.apply_inference_pool("llama")
            both = {"stays-rank-0", "goes-rank-0"}
            await wait_until(lambda: _equals(ready_engines(router), both), what="both ready")
            assert (await router.client.chat(MODEL))[0] == 200
            stays = (await router.client.engines_by_name())["stays-rank-0"]
            assert (stays["source"], stays["object"]) == ("inference-pool", "pod/llm/stays")
            assert stays["url"] == f"http://{stays_ip}:{cluster.port}"
            await cluster.api.refuse()
            await wait_until(
                lambda: _source_is(router, "watch_connected", False), what="the router blind"
            )
            cluster.api.delete_pod("llm", "goes")
            await goes.stop()
            await cluster.api.restore()
            await wait_until(
                lambda: _equals(ready_engines(router), {"stays-rank-0"}), what="the ghost gone"
            )
            assert (await router.client.chat(MODEL))[0] == 200
            source = (await router.client.health())["sources"][0]
            assert (source["name"], source["kind"]) == ("inference-pool", "inference-pool")
            assert source["removed_by_relist"] == 1
            assert source["watches"]["resources"] == ["pods", "inferencepools"]
            nothing = {"spec": {"selector": {"matchLabels": {"app": "none"}}}}
            cluster.patch_inference_pool("llama", nothing)
            unselected = "no routable engine: no pods match selector app=none in namespace llm"
            await wait_until(
                lambda: _contains(reasons(router), unselected), what="/health naming the selector"
            )
            cluster.delete_inference_pool("llama")
            await wait_until(
                lambda: _contains(reasons(router), missing), what="/health naming the pool again"
            )


async def _contains(found: Awaitable[list[str]], expected: str) -> bool:
    return expected in await found


async def _equals(found: Awaitable[set[str]], expected: set[str]) -> bool:
    return await found == expected


async def _source_is(router: RouterProcess, key: str, value: object) -> bool:
    return bool((await router.client.health())["sources"][0][key] == value)


async def test_a_malformed_pod_is_skipped_and_its_neighbours_kept(
    api: ApiServerSim, tmp_path: Path
) -> None:
    broken = make_pod("broken", labels=LLAMA, ip="10.0.0.1")
    broken["status"]["podIP"] = "not-an-address"
    api.apply_pod(broken)
    api.apply_pod(make_pod("good", labels=LLAMA, ip="10.0.0.2"))
    apply_pool(api)
    async with discovery(api, tmp_path) as (source, fleet):
        assert urls(fleet) == {"default/good-rank-0": "http://10.0.0.2:8000"}
        assert source.status.not_engine_counts() == {"malformed": 1}
        apply_pool(api, ports=(8000, 8001))
        await wait_until(lambda: len(urls(fleet)) == 2, what="the good pod on both ports")
        assert source.status.last_error is None
