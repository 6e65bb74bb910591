"""Kubernetes discovery end to end: kubernetes_asyncio through kube.py against the emulator.

Every test runs the real client against the API server emulator on loopback,
with a real Fleet, and injects the faults that made other routers go stale:
a blind period with a deletion, a silent stream, compacted history, an API
server that accepts and never answers. A few tests aim a tiny server of their
own at kube.py to feed it watch streams the emulator would never send. The
fleet's story tells why discovery removed each engine (`tests.support.story`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from headcount.config import ConfigError, DiscoveryMode, DiscoverySettings, ProbeSettings
from headcount.discovery import pods as pods_module
from headcount.discovery.build import build_k8s_source, k8s_source, lister_watcher
from headcount.discovery.errors import (
    ApiStatusError,
    ApiTimeout,
    ApiUnreachable,
    BadResponse,
    WatchExpired,
    WatchIdle,
)
from headcount.discovery.kube import KubeListerWatcher
from headcount.discovery.kubeconfig import load_kube_config
from headcount.discovery.listwatch import WatchEvent
from headcount.discovery.pods import pod_to_spec
from headcount.discovery.reflector import Reflector
from headcount.discovery.source import DiscoverySource
from headcount.fleet import EngineSpec, Fleet
from headcount.sim.apiserver import (
    ApiServerSim,
    ApiServerSimConfig,
    make_endpointslice,
    make_pod,
    make_service,
    running_apiserver,
)
from headcount.sim.loopback import free_port
from tests.support import wait_until
from tests.support.story import lines

PODS = DiscoverySettings(
    mode=DiscoveryMode.K8S_PODS,
    label_selector="app=vllm",
    watch_idle_timeout=5.0,
    request_timeout=2.0,
    connect_timeout=0.5,
    backoff_initial=0.05,
    backoff_max=0.5,
)
"""Pods selected by `app=vllm`, with timeouts and back-off short enough for test time."""
SERVICES = replace(PODS, mode=DiscoveryMode.K8S_SERVICES)
ENGINE = {"app": "vllm", "model": "llama"}


@pytest.fixture
async def api() -> AsyncIterator[ApiServerSim]:
    async with running_apiserver(ApiServerSimConfig(bookmark_interval=0.5)) as sim:
        yield sim


@asynccontextmanager
async def client_for(api: ApiServerSim, tmp_path: Path) -> AsyncIterator[ApiClient]:
    kube = await load_kube_config(api.kubeconfig(tmp_path / "kubeconfig"))
    async with ApiClient(kube.configuration) as client:
        yield client


def new_fleet() -> Fleet:
    return Fleet(unhealthy_after=ProbeSettings().unhealthy_after)


@asynccontextmanager
async def running(source: DiscoverySource) -> AsyncIterator[None]:
    task = asyncio.ensure_future(source.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled(), "the discovery loop ended on its own"


@asynccontextmanager
async def discovery(
    api: ApiServerSim, tmp_path: Path, settings: DiscoverySettings = PODS
) -> AsyncIterator[tuple[DiscoverySource, Fleet]]:
    """A synced source over the emulator's `default` namespace, as `settings` ask."""
    fleet = new_fleet()
    async with client_for(api, tmp_path) as client:
        source = k8s_source(
            settings,
            fleet,
            lambda resource: lister_watcher(client, resource, "default", settings),
            "default",
        )
        async with running(source):
            await wait_until(lambda: source.status.watch_connected, what="sync and watch")
            yield source, fleet


def truth(api: ApiServerSim) -> dict[str, EngineSpec]:
    """The engines the emulator's pods stand for: what the fleet must converge to."""
    specs = {}
    for pod in api.pods("default"):
        if pod["metadata"]["labels"].get("app") != "vllm":
            continue
        spec = pod_to_spec(pod, source="k8s-pods", engine_port=PODS.engine_port)
        if spec is not None:
            specs[spec.id] = spec
    return specs


def fleet_specs(fleet: Fleet) -> dict[str, EngineSpec]:
    return {engine.id: engine.spec for engine in fleet.snapshot.engines}


def names(fleet: Fleet) -> set[str]:
    return {engine.spec.name for engine in fleet.snapshot.engines}


async def converged(api: ApiServerSim, fleet: Fleet, timeout: float = 3.0) -> None:
    await wait_until(
        lambda: fleet_specs(fleet) == truth(api), timeout=timeout, what="fleet == emulator truth"
    )


# --- pods ------------------------------------------------------------------------------------


async def test_initial_sync_then_every_kind_of_event(api: ApiServerSim, tmp_path: Path) -> None:
    api.apply_pod(make_pod("a", labels=ENGINE, ip="10.0.0.1"))
    api.apply_pod(make_pod("b", labels=ENGINE, ip="10.0.0.2"))
    api.apply_pod(make_pod("starting", labels=ENGINE, ip="10.0.0.3", ready=False))
    api.apply_pod(make_pod("other-app", labels={"app": "web"}, ip="10.0.0.4"))
    async with discovery(api, tmp_path) as (source, fleet):
        assert names(fleet) == {"default/a", "default/b"}
        api.apply_pod(make_pod("starting", labels=ENGINE, ip="10.0.0.3", ready=True))
        api.apply_pod(make_pod("c", labels=ENGINE, ip="fd00::5"))
        api.patch("Pod", "default", "a", {"metadata": {"labels": {"sleeping": "true"}}})
        api.delete_pod("default", "b", graceful=True)  # terminating: no longer an engine
        await converged(api, fleet)
        assert names(fleet) == {"default/a", "default/starting", "default/c"}
        assert fleet_specs(fleet)[truth_id(api, "c")].url == "http://[fd00::5]:8000"
        assert fleet.snapshot.by_id[truth_id(api, "a")].spec.sleeping
        assert source.status.relists == {"start": 1}, "events alone, no relist needed"
        assert source.status.watch_connected and source.status.last_event is not None


def truth_id(api: ApiServerSim, name: str) -> str:
    pod = api.get("Pod", "default", name)
    assert pod is not None
    return str(pod["metadata"]["uid"])


async def test_bookmarks_keep_a_quiet_watch_fresh(api: ApiServerSim, tmp_path: Path) -> None:
    async with discovery(api, tmp_path, replace(PODS, watch_idle_timeout=1.5)) as (source, _):
        first = source.status.last_success
        await wait_until(
            lambda: (source.status.last_event or 0) > (first or 0) + 1.0,
            what="bookmarks moving freshness on",
        )
        assert source.status.relists == {"start": 1}, "bookmarks keep the idle timeout away"


async def test_a_pod_deleted_while_blind_is_gone_soon_after_the_api_returns(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_pod(make_pod("stays", labels=ENGINE, ip="10.0.0.1"))
    api.apply_pod(make_pod("deleted-while-blind", labels=ENGINE, ip="10.0.0.2"))
    async with discovery(api, tmp_path) as (source, fleet):
        assert len(fleet.snapshot.engines) == 2
        await api.refuse()
        await wait_until(lambda: source.status.last_error, what="the loop noticing")
        api.delete_pod("default", "deleted-while-blind")
        await api.restore()
        await wait_until(lambda: names(fleet) == {"default/stays"}, timeout=2.0)
        assert source.status.removed_by_relist == 1
        await wait_until(lambda: source.status.last_error is None, what="recovery")


async def test_the_api_coming_back_cuts_a_long_back_off_short(
    api: ApiServerSim, tmp_path: Path
) -> None:
    """Time to truth is about the reachability poll, not the rest of a 20 s back-off."""
    slow = replace(PODS, backoff_initial=20.0, backoff_max=20.0)
    api.apply_pod(make_pod("stays", labels=ENGINE, ip="10.0.0.1"))
    api.apply_pod(make_pod("deleted-while-blind", labels=ENGINE, ip="10.0.0.2"))
    async with discovery(api, tmp_path, slow) as (source, fleet):
        await api.refuse()
        await wait_until(lambda: source.status.last_error, what="the loop noticing")
        api.delete_pod("default", "deleted-while-blind")
        await asyncio.sleep(1.0)  # the blind period of the scenario
        await api.restore()
        await wait_until(lambda: names(fleet) == {"default/stays"}, timeout=1.0)


class ReconnectingWithoutRelist(Reflector):
    """The incident: after a lost watch, reconnect from now and never LIST again."""

    async def _round(self, reason: str) -> str:
        if not self.status.synced:
            return await super()._round(reason)
        try:
            return await self._watch("")
        except Exception as exc:
            await self._failed(exc, seen_down=False)
            return "error"


async def test_the_blind_deletion_scenario_catches_a_watch_that_reconnects_without_relisting(
    api: ApiServerSim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proof the scenario above can fail: without the relist the deleted pod stays forever."""
    monkeypatch.setattr(pods_module, "Reflector", ReconnectingWithoutRelist)
    api.apply_pod(make_pod("stays", labels=ENGINE, ip="10.0.0.1"))
    api.apply_pod(make_pod("deleted-while-blind", labels=ENGINE, ip="10.0.0.2"))
    async with discovery(api, tmp_path) as (source, fleet):
        await api.refuse()
        await wait_until(lambda: source.status.last_error, what="the loop noticing")
        api.delete_pod("default", "deleted-while-blind")
        await api.restore()
        await wait_until(lambda: source.status.watch_connected, what="the watch reconnecting")
        with pytest.raises(TimeoutError):
            await wait_until(lambda: names(fleet) == {"default/stays"}, timeout=2.0)


async def test_a_silently_stalled_watch_is_abandoned_for_a_relist(
    api: ApiServerSim, tmp_path: Path
) -> None:
    async with discovery(api, tmp_path, replace(PODS, watch_idle_timeout=1.0)) as (source, fleet):
        api.stall()
        api.apply_pod(make_pod("added-while-stalled", labels=ENGINE, ip="10.0.0.9"))
        await wait_until(lambda: names(fleet) == {"default/added-while-stalled"}, timeout=3.0)
        assert source.status.relists["idle-timeout"] >= 1
        await api.restore()


async def test_compacted_history_while_blind_converges(api: ApiServerSim, tmp_path: Path) -> None:
    for n in range(4):
        api.apply_pod(make_pod(f"p{n}", labels=ENGINE, ip=f"10.0.0.{n + 1}"))
    async with discovery(api, tmp_path) as (_, fleet):
        await api.refuse()
        api.delete_pod("default", "p0")
        api.apply_pod(make_pod("p1", labels=ENGINE, ip="10.0.0.1", ready=False))
        api.apply_pod(make_pod("p9", labels=ENGINE, ip="10.0.0.9"))
        api.compact()
        await api.restore()
        await converged(api, fleet)
        assert names(fleet) == {"default/p2", "default/p3", "default/p9"}


async def test_a_blackholed_api_times_out_and_the_loop_keeps_retrying(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_pod(make_pod("a", labels=ENGINE, ip="10.0.0.1"))
    settings = replace(PODS, watch_idle_timeout=0.6, request_timeout=0.3)
    async with discovery(api, tmp_path, settings) as (source, fleet):
        await api.blackhole()
        await wait_until(
            lambda: "no answer within 0.3s" in (source.status.last_error or ""),
            what="a LIST timing out",
        )
        errors = source.status.relists["error"]
        await wait_until(lambda: source.status.relists["error"] >= errors + 2, what="retries")
        assert names(fleet) == {"default/a"}, "what we knew stays while we cannot know better"
        api.apply_pod(make_pod("b", labels=ENGINE, ip="10.0.0.2"))
        await api.restore()
        await converged(api, fleet)
        await wait_until(lambda: source.status.last_error is None, what="recovery")


@pytest.mark.parametrize("reset", [False, True])
async def test_a_dropped_watch_is_followed_by_a_relist(
    api: ApiServerSim, tmp_path: Path, reset: bool
) -> None:
    async with discovery(api, tmp_path) as (source, fleet):
        await wait_until(lambda: api.open_watches == 1, what="the watch")
        await api.drop_watches(reset=reset)
        await wait_until(lambda: sum(source.status.relists.values()) >= 2, what="a relist")
        api.apply_pod(make_pod("after", labels=ENGINE, ip="10.0.0.1"))
        await converged(api, fleet)


async def test_a_malformed_pod_is_skipped_and_the_good_one_kept(
    api: ApiServerSim, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = make_pod("broken", labels=ENGINE, ip="10.0.0.1")
    broken["status"]["podIP"] = "not-an-address"
    api.apply_pod(broken)
    api.apply_pod(make_pod("good", labels=ENGINE, ip="10.0.0.2"))
    with caplog.at_level(logging.WARNING, logger="headcount.discovery"):
        async with discovery(api, tmp_path) as (source, fleet):
            assert names(fleet) == {"default/good"}
            api.patch("Pod", "default", "broken", {"status": {"conditions": "Ready"}})
            api.apply_pod(make_pod("later", labels=ENGINE, ip="10.0.0.3"))
            await wait_until(lambda: names(fleet) == {"default/good", "default/later"})
            assert source.status.last_error is None
    assert sum("default/broken" in r.getMessage() for r in caplog.records) == 2


# --- services --------------------------------------------------------------------------------


async def test_a_slice_readiness_flip_updates_the_engine_without_a_service_event(
    api: ApiServerSim, tmp_path: Path
) -> None:
    service = api.apply_service(make_service("llama", labels=ENGINE, ports=(80, 8000)))
    api.apply_endpointslice(make_endpointslice("llama", [("10.1.0.1", False)]))
    async with discovery(api, tmp_path, SERVICES) as (source, fleet):
        engine = fleet.snapshot.by_id[service["metadata"]["uid"]]
        assert engine.spec.url == "http://llama.default:8000" and not engine.spec.ready
        api.apply_endpointslice(make_endpointslice("llama", [("10.1.0.1", True)]))
        await wait_until(lambda: fleet.snapshot.by_id[engine.id].spec.ready, timeout=3.0)
        assert (
            fleet.snapshot.by_id[engine.id].spec.resource_version
            == (service["metadata"]["resourceVersion"])
        ), "the Service itself never changed"
        api.delete_endpointslice("default", "llama-slice")
        await wait_until(lambda: not fleet.snapshot.by_id[engine.id].spec.ready, timeout=3.0)
        assert source.status.watch_connected


async def test_a_headless_service_is_isolated_from_the_good_one(
    api: ApiServerSim, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api.apply_service(make_service("good", labels=ENGINE))
    api.apply_service(make_service("headless", labels=ENGINE, cluster_ip="None"))
    api.apply_endpointslice(make_endpointslice("good", [("10.1.0.1", True)]))
    api.apply_endpointslice(make_endpointslice("headless", [("10.1.0.2", True)]))
    with caplog.at_level(logging.WARNING, logger="headcount.discovery"):
        async with discovery(api, tmp_path, SERVICES) as (_, fleet):
            assert names(fleet) == {"default/good"}
            api.apply_endpointslice(make_endpointslice("headless", [("10.1.0.2", False)]))
            api.apply_service(make_service("new", labels=ENGINE))
            await wait_until(lambda: names(fleet) == {"default/good", "default/new"})
    assert sum("default/headless" in r.getMessage() for r in caplog.records) == 1


async def test_a_service_deleted_while_blind_is_removed_by_the_relist(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_service(make_service("stays", labels=ENGINE))
    api.apply_service(make_service("goes", labels=ENGINE))
    async with discovery(api, tmp_path, SERVICES) as (source, fleet):
        assert names(fleet) == {"default/stays", "default/goes"}
        await api.refuse()
        await wait_until(lambda: source.status.last_error, what="the loop noticing")
        api.delete_service("default", "goes")
        await api.restore()
        await wait_until(lambda: names(fleet) == {"default/stays"}, timeout=3.0)
        assert source.status.removed_by_relist == 1


# --- the fleet's story: why discovery removed each engine ----------------------------------------


async def test_discovery_tells_why_each_pod_left_the_fleet(
    api: ApiServerSim, tmp_path: Path, story: pytest.LogCaptureFixture
) -> None:
    for name, ip in (("deleted", "10.0.0.1"), ("relabelled", "10.0.0.2"), ("unready", "10.0.0.3")):
        api.apply_pod(make_pod(name, labels=ENGINE, ip=ip))
    api.apply_pod(make_pod("terminating", labels=ENGINE, ip="10.0.0.4"))
    async with discovery(api, tmp_path) as (_, fleet):
        assert len(names(fleet)) == 4
        lines(story)
        api.delete_pod("default", "deleted", graceful=True)
        api.patch("Pod", "default", "relabelled", {"metadata": {"labels": {"app": "web"}}})
        api.apply_pod(make_pod("unready", labels=ENGINE, ip="10.0.0.3", ready=False))
        api.delete_pod("default", "terminating", graceful=True)
        api.delete_pod("default", "terminating")
        await wait_until(lambda: not names(fleet), what="every engine gone")
    removals = [(m.split()[1], (level, m.rsplit(": ", 1)[1])) for level, m in lines(story)]
    told = dict(removals)
    assert len(told) == len(removals), "one line per engine"
    assert told == {
        "default/deleted": (logging.INFO, "terminating"),
        "default/relabelled": (logging.INFO, "pod deleted or no longer selected"),
        "default/unready": (logging.WARNING, "not ready"),
        "default/terminating": (logging.INFO, "terminating"),
    }


async def test_discovery_tells_why_each_service_left_the_fleet(
    api: ApiServerSim, tmp_path: Path, story: pytest.LogCaptureFixture
) -> None:
    for name in ("unready", "headless", "deleted"):
        api.apply_service(make_service(name, labels=ENGINE))
        api.apply_endpointslice(make_endpointslice(name, [("10.1.0.1", True)]))
    async with discovery(api, tmp_path, SERVICES) as (_, fleet):
        assert len(names(fleet)) == 3
        lines(story)
        api.apply_endpointslice(make_endpointslice("unready", [("10.1.0.1", False)]))
        api.apply_service(make_service("headless", labels=ENGINE, cluster_ip="None"))
        api.delete_service("default", "deleted")
        await wait_until(lambda: names(fleet) == {"default/unready"}, what="two engines gone")
        await wait_until(lambda: not fleet.snapshot.engines[0].spec.ready, what="not ready")
    assert sorted(lines(story)) == [
        (
            logging.INFO,
            "engine default/deleted removed from k8s-services (was pending): "
            "service deleted or no longer selected",
        ),
        (
            logging.INFO,
            "engine default/headless removed from k8s-services (was pending): headless",
        ),
        (logging.INFO, "engine default/unready not_ready (was pending): not ready at k8s-services"),
    ]


# --- the factory and the configuration -------------------------------------------------------


async def test_build_k8s_source_discovers_pods_and_closes_its_client(
    api: ApiServerSim, tmp_path: Path
) -> None:
    api.apply_pod(make_pod("a", namespace="llm", labels=ENGINE, ip="10.0.0.1"))
    api.apply_pod(make_pod("elsewhere", labels=ENGINE, ip="10.0.0.2"))
    settings = DiscoverySettings(
        mode=DiscoveryMode.K8S_PODS,
        kubeconfig=api.kubeconfig(tmp_path / "kubeconfig", namespace="llm"),
        label_selector="app=vllm",
        backoff_initial=0.05,
        backoff_max=0.5,
    )
    fleet = new_fleet()
    source = await build_k8s_source(settings, fleet)
    task = asyncio.ensure_future(source.run())
    try:
        await wait_until(lambda: source.status.synced)
        assert names(fleet) == {"llm/a"}, "the kubeconfig context's namespace"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert source._api.rest_client.pool_manager.closed  # type: ignore[attr-defined]


async def test_build_k8s_source_builds_a_service_source(api: ApiServerSim, tmp_path: Path) -> None:
    settings = DiscoverySettings(
        mode=DiscoveryMode.K8S_SERVICES,
        kubeconfig=api.kubeconfig(tmp_path / "kubeconfig"),
        namespace="default",
    )
    source = await build_k8s_source(settings, new_fleet())
    task = asyncio.ensure_future(source.run())
    try:
        await wait_until(lambda: source.status.synced)
        assert source.status.kind == "k8s-services"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_kubeconfig_comes_from_the_environment_then_the_home_directory(
    api: ApiServerSim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = api.kubeconfig(tmp_path / "from-env", namespace="from-env")
    kube = await load_kube_config(environ={"KUBECONFIG": str(path)})
    assert kube.namespace == "from-env" and kube.configuration.host == api.url
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    api.kubeconfig(home / ".kube" / "config", namespace="from-home")
    monkeypatch.setenv("HOME", str(home))
    assert (await load_kube_config(environ={})).namespace == "from-home"


async def test_no_configuration_at_all_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="--kubeconfig"):
        await load_kube_config(environ={})


async def test_in_cluster_configuration_uses_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("secret-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "namespace").write_text("llm\n")
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    kube = await load_kube_config(environ=environ, service_account_dir=tmp_path)
    assert kube.namespace == "llm" and kube.origin == "in-cluster"
    assert kube.configuration.host == "https://10.96.0.1:443"
    assert kube.configuration.api_key["BearerToken"] == "Bearer secret-token"


# --- kube.py's stream reading, against a server of our own ----------------------------------


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def tiny_server(handler: Handler) -> AsyncIterator[KubeListerWatcher]:
    """A server answering every pods request with `handler`, and a ListerWatcher aimed at it."""
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/default/pods", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    configuration = Configuration(host=f"http://127.0.0.1:{port}")
    try:
        async with ApiClient(configuration) as client:
            settings = replace(PODS, watch_idle_timeout=0.5, request_timeout=0.5)
            yield lister_watcher(client, "pods", "default", settings)
    finally:
        await runner.cleanup()


def streaming(*chunks: bytes, status: int = 200, hold: bool = False) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
            await asyncio.sleep(0.01)  # one chunk at a time on the wire
        if hold:
            await asyncio.Event().wait()
        await response.write_eof()
        return response

    return handler


def line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


async def read_all(pods: KubeListerWatcher) -> list[WatchEvent]:
    async with pods.watch("1", 60, "") as stream:
        return [event async for event in stream]


async def test_watch_lines_split_anywhere_and_very_long_ones_are_read_whole() -> None:
    big = {"metadata": {"name": "big", "resourceVersion": "3"}, "blob": "x" * 3_000_000}
    payload = line("ADDED", {"metadata": {"name": "a"}}) + b"\n" + line("MODIFIED", big)
    payload += line("BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    rng = random.Random(3)
    cuts = sorted({*rng.sample(range(1, len(payload)), 40), 7, 8, 9})
    chunks = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
    async with tiny_server(streaming(*chunks)) as pods:
        events = await read_all(pods)
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "BOOKMARK"]
    assert len(events[1].object["blob"]) == 3_000_000


@pytest.mark.parametrize(
    ("chunks", "status", "error"),
    [
        (
            (line("ERROR", {"kind": "Status", "code": 410, "message": "too old"}),),
            200,
            WatchExpired,
        ),
        ((json.dumps({"kind": "Status", "code": 410}).encode(),), 410, WatchExpired),
        ((json.dumps({"kind": "Status", "message": "forbidden"}).encode(),), 403, ApiStatusError),
        ((line("ERROR", {"kind": "Status", "code": 500, "message": "etcd"}),), 200, ApiStatusError),
        ((b"not json\n",), 200, BadResponse),
        ((b'{"type": "ADDED", "object": {"metadata"',), 200, BadResponse),
    ],
)
async def test_watch_errors_are_translated(
    chunks: tuple[bytes, ...], status: int, error: type[Exception]
) -> None:
    async with tiny_server(streaming(*chunks, status=status)) as pods:
        with pytest.raises(error) as raised:
            await read_all(pods)
    if error is ApiStatusError:
        assert isinstance(raised.value, ApiStatusError) and raised.value.code in (403, 500)
        assert not isinstance(raised.value, WatchExpired)


async def test_a_silent_watch_stream_raises_watch_idle_after_the_idle_timeout() -> None:
    first = line("ADDED", {"metadata": {"name": "a"}})
    async with tiny_server(streaming(first, hold=True)) as pods:
        seen: list[WatchEvent] = []
        async with asyncio.timeout(5):
            with pytest.raises(WatchIdle):
                async with pods.watch("1", 60, "") as stream:
                    async for event in stream:
                        seen.append(event)
                        await asyncio.sleep(0.8)  # a slow consumer is not an idle stream
    assert [e.type for e in seen] == ["ADDED"]


async def test_list_errors_are_translated() -> None:
    async def forbidden(request: web.Request) -> web.Response:
        body = {"kind": "Status", "code": 403, "message": 'pods is forbidden: User "x"'}
        return web.json_response(body, status=403)

    async with tiny_server(forbidden) as pods:
        with pytest.raises(ApiStatusError, match="forbidden") as raised:
            await pods.list("")
    assert raised.value.code == 403

    async def never(request: web.Request) -> web.Response:
        await asyncio.Event().wait()
        raise AssertionError

    async with tiny_server(never) as pods:
        with pytest.raises(ApiTimeout, match=r"no answer within 0\.5s"):
            await pods.list("")

    async with ApiClient(Configuration(host=f"http://127.0.0.1:{free_port()}")) as client:
        with pytest.raises(ApiUnreachable):
            await lister_watcher(client, "pods", "default", PODS).list("")


# --- churn -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_churn_with_faults_converges_to_the_truth(
    api: ApiServerSim, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    names_used = [f"p{n}" for n in range(8)]
    settings = replace(PODS, watch_idle_timeout=0.5, request_timeout=0.5)
    async with discovery(api, tmp_path, settings) as (_, fleet):
        faulty = False
        for step in range(40):
            roll = rng.random()
            name = rng.choice(names_used)
            if roll < 0.45:
                labels = {**ENGINE, "sleeping": rng.choice(["true", "false"])}
                if rng.random() < 0.2:
                    labels["app"] = "other"
                api.apply_pod(
                    make_pod(
                        name,
                        labels=labels,
                        ip=f"10.0.{seed}.{rng.randrange(1, 250)}",
                        ready=rng.random() < 0.8,
                    )
                )
            elif roll < 0.7:
                if api.get("Pod", "default", name) is not None:
                    api.delete_pod("default", name, graceful=rng.random() < 0.3)
            elif faulty:
                await api.restore()
                faulty = False
            else:
                fault = rng.choice(["drop", "reset", "stall", "refuse", "compact"])
                if fault in ("drop", "reset"):
                    await api.drop_watches(reset=fault == "reset")
                elif fault == "stall":
                    api.stall()
                    faulty = True
                elif fault == "refuse":
                    await api.refuse()
                    faulty = True
                else:
                    api.compact()
            if step % 5 == 0:
                await asyncio.sleep(rng.uniform(0, 0.2))  # let some rounds interleave
        await api.restore()
        await converged(api, fleet)
