"""headcount's core promise, checked on the router as a real process over a simulated cluster.

The fleet it routes to is the fleet that exists, within seconds of the API
server being reachable; while it cannot know, routing stays safe (fail over,
never hang). Each test runs `headcount serve --discovery k8s-pods` as a child
process against the API server emulator (on the test's own loop) and simulated
engines on loopback IPs, injects one kind of trouble, and judges the router
only from outside: `/engines`, `/v1/models`, `/health`, `/metrics`, requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from headcount.sim.apiserver import make_pod
from headcount.sim.cluster import (
    ENGINE_LABELS,
    RouterProcess,
    SimCluster,
    Timings,
    hosts,
    sim_cluster,
    steady_traffic,
)
from tests.support import wait_until

MODEL = "sim-model"
NAMESPACE = "llm"
ROUTER_TIMINGS = Timings(
    probe_interval=0.5,
    backoff_initial=0.05,
    backoff_max=0.5,
    api_request_timeout=1,
    api_connect_timeout=0.5,
    watch_idle_timeout=2,
    connect_timeout=0.3,
    discovery_stale_after=2,
    drain_delay=0,
    drain_timeout=2,
)
"""Small enough for a test to see recoveries within seconds; the idle timeout is 4 bookmarks."""


def llm_cluster(
    tmp_path: Path, addresses: Iterable[str]
) -> contextlib.AbstractAsyncContextManager[SimCluster]:
    """The emulator, bookmarks every 0.5 s, engine pods in namespace `llm` on `addresses`."""
    return sim_cluster(tmp_path, addresses, namespace=NAMESPACE, bookmark_interval=0.5)


def router_on(cluster: SimCluster, timings: Timings = ROUTER_TIMINGS) -> RouterProcess:
    return RouterProcess(cluster.router_flags(timings))


def _is_engine_pod(pod: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    """The truth a router must converge to, restated from docs/ARCHITECTURE.md, not imported."""
    metadata, status = pod["metadata"], pod.get("status") or {}
    labels = metadata.get("labels") or {}
    conditions = status.get("conditions")
    ready = isinstance(conditions, list) and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )
    return (
        all(labels.get(key) == value for key, value in selector.items())
        and bool(status.get("podIP"))
        and status.get("phase") == "Running"
        and ready
        and not metadata.get("deletionTimestamp")
    )


def truth(cluster: SimCluster) -> set[str]:
    """UIDs of the pods that must be engines: selected, Running, Ready, an IP, not deleting.

    Computed here from the pod objects, independently of the router's own mapping.
    """
    return {
        str(pod["metadata"]["uid"])
        for pod in cluster.api.pods(NAMESPACE)
        if _is_engine_pod(pod, ENGINE_LABELS)
    }


class Blackhole:
    """Loopback servers that take connections and never answer a byte.

    `listen_only(host, port)`: a socket that listens and never accepts (the
    kernel completes handshakes until its backlog is full); `accept_silently`:
    accepts, reads, never answers. `close()` ends both kinds.
    """

    def __init__(self) -> None:
        self._sockets: list[socket.socket] = []
        self._servers: list[asyncio.Server] = []
        self._held: set[asyncio.StreamWriter] = set()

    def listen_only(self, host: str, port: int) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1)
        self._sockets.append(sock)

    async def accept_silently(self, host: str, port: int) -> None:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._held.add(writer)
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass
            self._held.discard(writer)
            writer.close()

        self._servers.append(await asyncio.start_server(hold, host, port, reuse_address=True))

    async def close(self) -> None:
        for sock in self._sockets:
            sock.close()
        for writer in self._held:
            writer.transport.abort()
        for server in self._servers:
            server.close()
            await server.wait_closed()


async def engine_states(router: RouterProcess) -> dict[str, str]:
    """Pod name -> the router's state for its engine."""
    engines = await router.client.engines_by_name()
    return {name: engine["state"] for name, engine in engines.items()}


def all_ready(router: RouterProcess, names: set[str]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        states = await engine_states(router)
        return set(states) == names and all(state == "ready" for state in states.values())

    return check


def engine_ids_equal_truth(
    router: RouterProcess, cluster: SimCluster
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        engines = await router.client.engines_by_name()
        return {engine["id"] for engine in engines.values()} == truth(cluster)

    return check


async def source_health(router: RouterProcess) -> dict[str, Any]:
    source: dict[str, Any] = (await router.client.health())["sources"][0]
    return source


def watch_connected(router: RouterProcess, connected: bool) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await source_health(router))["watch_connected"] is connected

    return check


async def within(
    seconds: float, condition: Callable[[], Awaitable[Any]], router: RouterProcess, what: str
) -> float:
    """Wait for `condition` at most `seconds`; return how long it took; the log on failure."""
    started = time.monotonic()
    try:
        await wait_until(condition, timeout=seconds, interval=0.05, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- router log ---\n{router.log()}") from None
    return time.monotonic() - started


# --- 1. blind, a deletion, the API back ----------------------------------------------------------


async def test_a_pod_deleted_while_blind_leaves_soon_after_the_api_returns_and_no_request_fails(
    tmp_path: Path,
) -> None:
    stays_ip, goes_ip = hosts("127.0.1", 2)
    async with llm_cluster(tmp_path, [stays_ip, goes_ip]) as cluster:
        await cluster.add_engine("stays", stays_ip, model=MODEL)
        goes = await cluster.add_engine("goes", goes_ip, model=MODEL)
        async with router_on(cluster) as router:
            await within(5, all_ready(router, {"stays", "goes"}), router, "both engines ready")
            async with steady_traffic(router.url, MODEL, max_seconds=20) as traffic:
                await wait_until(lambda: traffic.ok >= 5, what="traffic flowing")
                await cluster.api.refuse()
                await within(3, watch_connected(router, False), router, "the router blind")
                cluster.api.delete_pod(NAMESPACE, "goes")
                await goes.stop()
                await asyncio.sleep(1.0)  # the blind period: the router cannot know
                assert "goes" in await engine_states(router), "it cannot know yet"
                await cluster.api.restore()

                async def ghost_gone() -> bool:
                    return "goes" not in await engine_states(router)

                took = await within(2.0, ghost_gone, router, "the deleted pod's engine gone")
                sent = traffic.sent
                await wait_until(lambda: traffic.sent >= sent + 5, what="traffic after the truth")
            assert traffic.failures == [], (
                f"{len(traffic.failures)} of {traffic.sent} requests failed: "
                f"{traffic.failures[:5]}\n{router.log()}"
            )
            assert traffic.cut == 0, "an answer was broken off mid-body"
            assert traffic.ok == traffic.sent
            source = await source_health(router)
            assert source["removed_by_relist"] >= 1, source
            client = router.client
            removed = await client.metric_value("headcount_discovery_reconcile_removed_total")
            assert removed >= 1
            assert await client.metric_value("headcount_upstream_failovers_total") >= 1, (
                "the stopped engine was never tried: the scenario did not exercise failover"
            )
            assert took < 2.0


# --- 2. a watch that stalls silently -------------------------------------------------------------


async def test_a_pod_added_while_the_watch_is_silently_stalled_is_routable_within_5s(
    tmp_path: Path,
) -> None:
    first_ip, late_ip = hosts("127.0.2", 2)
    async with llm_cluster(tmp_path, [first_ip, late_ip]) as cluster:
        await cluster.add_engine("first", first_ip, model=MODEL)
        async with router_on(cluster) as router:
            await within(5, all_ready(router, {"first"}), router, "the first engine ready")
            await within(3, watch_connected(router, True), router, "the watch open")
            cluster.api.stall()
            await cluster.add_engine("late", late_ip, model="late-model")
            await within(5.0, lambda: router.client.routable("late-model"), router, "late routable")
            source = await source_health(router)
            assert source["relists"].get("idle-timeout", 0) >= 1, source
            await cluster.api.restore()


# --- 3. history compacted while blind ------------------------------------------------------------


async def test_changes_made_while_blind_and_then_compacted_away_converge_within_3s(
    tmp_path: Path,
) -> None:
    addresses = hosts("127.0.3", 4)
    async with llm_cluster(tmp_path, addresses) as cluster:
        for name, ip in zip(("p1", "p2", "p3"), addresses, strict=False):
            await cluster.add_engine(name, ip, model=MODEL)
        async with router_on(cluster) as router:
            await within(5, all_ready(router, {"p1", "p2", "p3"}), router, "three engines ready")
            await cluster.api.refuse()
            await within(3, watch_connected(router, False), router, "the router blind")
            cluster.api.delete_pod(NAMESPACE, "p1")
            cluster.apply_pod("p2", addresses[1], model=MODEL, ready=False)
            await cluster.add_engine("p4", addresses[3], model=MODEL)
            cluster.api.compact()
            await cluster.api.restore()
            await within(3.0, engine_ids_equal_truth(router, cluster), router, "the truth")
            assert set(await engine_states(router)) == {"p3", "p4"}


# --- 4. one pod's transitions --------------------------------------------------------------------


def not_ready(cluster: SimCluster, ip: str) -> None:
    cluster.apply_pod("subject", ip, model="subject-model", ready=False)


def ip_cleared(cluster: SimCluster, ip: str) -> None:
    cluster.api.patch("Pod", NAMESPACE, "subject", {"status": {"podIP": None, "podIPs": None}})


def terminating(cluster: SimCluster, ip: str) -> None:
    cluster.api.delete_pod(NAMESPACE, "subject", graceful=True)


def unselected(cluster: SimCluster, ip: str) -> None:
    cluster.api.patch("Pod", NAMESPACE, "subject", {"metadata": {"labels": {"app": "other"}}})


@pytest.mark.parametrize("transition", [not_ready, ip_cleared, terminating, unselected])
async def test_a_pod_that_stops_being_an_engine_leaves_the_fleet_within_2s(
    tmp_path: Path, transition: Callable[[SimCluster, str], None]
) -> None:
    steady_ip, subject_ip = hosts("127.0.4", 2)
    async with llm_cluster(tmp_path, [steady_ip, subject_ip]) as cluster:
        await cluster.add_engine("steady", steady_ip, model=MODEL)
        await cluster.add_engine("subject", subject_ip, model="subject-model")
        async with router_on(cluster) as router:
            await within(5, all_ready(router, {"steady", "subject"}), router, "engines ready")
            assert await router.client.routable("subject-model")
            transition(cluster, subject_ip)

            async def removed() -> bool:
                return set(await engine_states(router)) == {"steady"}

            await within(2.0, removed, router, f"{transition.__name__}: subject removed")
            status, body = await router.client.chat("subject-model")
            assert status == 404, body
            assert await router.client.routable(MODEL)


async def test_a_sleeping_pod_is_kept_but_not_routed_and_wakes_up_within_2s(
    tmp_path: Path,
) -> None:
    steady_ip, subject_ip = hosts("127.0.4", 2)
    async with llm_cluster(tmp_path, [steady_ip, subject_ip]) as cluster:
        await cluster.add_engine("steady", steady_ip, model=MODEL)
        await cluster.add_engine("subject", subject_ip, model="subject-model")
        async with router_on(cluster) as router:
            await within(5, all_ready(router, {"steady", "subject"}), router, "engines ready")
            asleep = {"metadata": {"labels": {"sleeping": "true"}}}
            cluster.api.patch("Pod", NAMESPACE, "subject", asleep)

            async def state_is(state: str) -> bool:
                return (await engine_states(router)).get("subject") == state

            await within(2.0, lambda: state_is("sleeping"), router, "subject sleeping")
            status, body = await router.client.chat("subject-model")
            assert status == 503, body
            awake = {"metadata": {"labels": {"sleeping": None}}}
            cluster.api.patch("Pod", NAMESPACE, "subject", awake)
            await within(2.0, lambda: router.client.routable("subject-model"), router, "awake")
            assert await state_is("ready")


async def test_a_lora_modified_annotation_makes_new_adapters_routable_within_2s(
    tmp_path: Path,
) -> None:
    (ip,) = hosts("127.0.4", 1)
    async with llm_cluster(tmp_path, [ip]) as cluster:
        engine = await cluster.add_engine("subject", ip, model=MODEL)
        # probes on an interval would find the adapter on their own: only the annotation may
        async with router_on(cluster, replace(ROUTER_TIMINGS, probe_interval=60)) as router:
            await within(5, all_ready(router, {"subject"}), router, "the engine ready")
            engine.set_adapters(["new-lora"])
            models = await router.client.get_json("/v1/models")
            assert [card["id"] for card in models["data"]] == [MODEL], "not re-read yet"
            changed = {"metadata": {"annotations": {"lora-modified": "1"}}}
            cluster.api.patch("Pod", NAMESPACE, "subject", changed)

            async def adapter_listed() -> bool:
                models = await router.client.get_json("/v1/models")
                return "new-lora" in {card["id"] for card in models["data"]}

            await within(2.0, adapter_listed, router, "new-lora in /v1/models")
            status, body = await router.client.chat("new-lora")
            assert status == 200, body


# --- 5. isolation --------------------------------------------------------------------------------


def malformed_pod(cluster: SimCluster, ip: str) -> dict[str, Any]:
    """An engine pod whose `status.conditions` is a map, not a list: the mapping chokes on it."""
    labels = {**ENGINE_LABELS, "model": MODEL}
    pod = make_pod("broken", namespace=NAMESPACE, labels=labels, ip=ip, port=cluster.port)
    pod["status"]["conditions"] = {"Ready": "True"}
    return pod


async def test_a_good_engine_is_routable_promptly_beside_a_malformed_pod_and_ten_unreachable(
    tmp_path: Path,
) -> None:
    good_ip, broken_ip, *unreachable = hosts("127.0.5", 12)
    blackhole = Blackhole()
    async with llm_cluster(tmp_path, [good_ip, broken_ip, *unreachable]) as cluster:
        try:
            await cluster.start_engine("good", good_ip, model=MODEL)
            unreachable_names = set()
            for n, ip in enumerate(unreachable):
                kind = ("listening", "silent", "closed")[n % 3]
                if kind == "listening":
                    blackhole.listen_only(ip, cluster.port)  # never accepts
                elif kind == "silent":
                    await blackhole.accept_silently(ip, cluster.port)  # accepts, never answers
                name = f"a-{kind}-{n}"  # sorts, and is probed, before the good one
                cluster.apply_pod(name, ip, model=MODEL)
                unreachable_names.add(name)
            cluster.api.apply_pod(malformed_pod(cluster, broken_ip))
            cluster.apply_pod("good", good_ip, model=MODEL)
            async with router_on(cluster, replace(ROUTER_TIMINGS, probe_timeout=1)) as router:
                # timed from the first answer of /livez: the process's own start-up excluded
                good_routable = functools.partial(router.client.routable, MODEL)
                await within(0.3 + 2.0, good_routable, router, "good engine")

                async def unreachable_out_of_rotation() -> bool:
                    states = await engine_states(router)
                    return set(states) == {"good", *unreachable_names} and all(
                        states[name] == "unhealthy" for name in unreachable_names
                    )

                await within(2.0, unreachable_out_of_rotation, router, "probes timing out")
                assert "skipping llm/broken" in router.log()
                assert (await source_health(router))["last_error"] is None
        finally:
            await blackhole.close()


# --- 6. random churn -----------------------------------------------------------------------------


POD_NAMES = [f"p{n}" for n in range(8)]
FAULTS = ["refuse", "refuse", "refuse", "stall", "stall", "compact", "compact", "drop", "reset"]
"""Weighted to the faults that hide changes until `restore`, when a relist must find them."""


def random_pod(cluster: SimCluster, rng: random.Random, name: str, addresses: list[str]) -> None:
    """Create or replace pod `name`: usually an engine, sometimes asleep, unready or unselected."""
    labels = {"sleeping": rng.choice(["true", "false"])}
    if rng.random() < 0.15:
        labels["app"] = "other"
    ip = rng.choice(addresses)
    cluster.apply_pod(name, ip, model=MODEL, labels=labels, ready=rng.random() < 0.8)


async def churn_step(cluster: SimCluster, rng: random.Random, addresses: list[str]) -> None:
    """One random fault (some last until `restore`), or one change to a random pod."""
    roll = rng.random()
    if roll < 0.35:
        fault = rng.choice(FAULTS)
        if fault in ("drop", "reset"):
            await cluster.api.drop_watches(reset=fault == "reset")
        elif fault == "stall":
            cluster.api.stall()
        elif fault == "refuse":
            await cluster.api.refuse()
        else:
            cluster.api.compact()
        return
    name = rng.choice(POD_NAMES)
    if roll < 0.5 or cluster.api.get("Pod", NAMESPACE, name) is None:
        random_pod(cluster, rng, name, addresses)
    elif roll < 0.75:
        patches: list[dict[str, Any]] = [
            {"metadata": {"labels": {"app": rng.choice(["engine", "other"])}}},
            {"metadata": {"labels": {"sleeping": rng.choice(["true", None])}}},
            {"status": {"podIP": rng.choice([None, *addresses])}},
        ]
        cluster.api.patch("Pod", NAMESPACE, name, rng.choice(patches))
    else:
        cluster.api.delete_pod(NAMESPACE, name, graceful=rng.random() < 0.3)


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_churn_with_faults_converges_to_the_truth_after_every_round(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    addresses = hosts("127.0.6", 2)
    async with llm_cluster(tmp_path, addresses) as cluster:
        for ip in addresses:  # every pod points at one of two shared engines
            await cluster.start_engine(ip, ip, model=MODEL)
        for name in POD_NAMES:
            random_pod(cluster, rng, name, addresses)
        async with router_on(cluster) as router:
            await within(5, watch_connected(router, True), router, "the first sync")
            for round_ in range(8):
                for _ in range(5):
                    await churn_step(cluster, rng, addresses)
                    await asyncio.sleep(rng.uniform(0, 0.15))  # let changes and rounds interleave
                await cluster.api.restore()
                await within(
                    3.0,
                    engine_ids_equal_truth(router, cluster),
                    router,
                    f"seed {seed} round {round_}: /engines == the emulator's truth",
                )
