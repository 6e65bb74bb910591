"""kv-aware routing through the real process: warm routing, and every event-stream fault.

A `headcount serve --routing kv-aware` child routes over simulated engines that
keep a prefix cache and publish vLLM's KV events (the simulator's publisher is
vLLM's, faults included). Each engine has its own loopback address and all
share one HTTP port and one pair of KV-event ports, as pods do. A prompt is
made warm on a chosen engine by sending it there directly, bypassing the
router, so only the events can tell the router where it is cached. Each fault
is injected through the engine's `/sim/kv-events`; the router is judged from
outside only: the route receipt headers, `/engines`, `/health`, `/metrics`,
and the engine's own truth (`/sim/kv-cache/predict`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import RouterFlags, RouterProcess, Timings, hosts, sim_cluster
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine, start_engine
from headcount.sim.engine.kv_events_config import KvEventsConfig
from headcount.sim.loopback import free_port_on_all
from tests.support import wait_until

__all__: list[str] = []

pytestmark = pytest.mark.timeout(90)

MODEL = "sim-model"
BLOCK = 16
IDLE_TIMEOUT = 1.5
"""--kv-events-idle-timeout: short, so an unconfirmed stream turns stale within the test."""
CHECK_INTERVAL = 0.3
"""--kv-events-check-interval: under the idle timeout less the replay timeout (1 s)."""
TIMEOUT = 10.0


@dataclass
class Fleet:
    router: RouterProcess
    engines: dict[str, SimEngine]
    session: aiohttp.ClientSession

    def engine(self, name: str) -> SimEngine:
        return self.engines[name]


def _config(
    host: str, port: int, name: str, events: tuple[int, int] | None, token_delay: float = 0.0
) -> EngineSimConfig:
    return EngineSimConfig(
        host=host,
        port=port,
        model=MODEL,
        name=name,
        kv_blocks=600,
        block_size=BLOCK,
        prefill_tokens_per_s=1_000_000.0,
        token_delay=token_delay,
        kv_events=None if events is None else KvEventsConfig(events[0], replay_port=events[1]),
    )


def _router_flags(
    backends: Sequence[str], events: tuple[int, int], placement: str | None = None
) -> RouterFlags:
    return RouterFlags(
        discovery=DiscoveryMode.STATIC,
        backends=tuple(backends),
        routing=RoutingName.KV_AWARE,
        tokenizer="builtin",
        kv_events_port=events[0],
        kv_events_replay_port=events[1],
        kv_placement=placement,
        timings=Timings(
            probe_interval=0.2,
            drain_delay=0,
            kv_events_idle_timeout=IDLE_TIMEOUT,
            kv_events_check_interval=CHECK_INTERVAL,
            kv_events_replay_timeout=1.0,
        ),
    )


@contextlib.asynccontextmanager
async def kv_fleet(
    *publishing: bool,
    prefix: str = "127.0.5",
    token_delay: float = 0.0,
    placement: str | None = None,
) -> AsyncIterator[Fleet]:
    """A kv-aware router before one engine per entry, named a, b, ...; False: no publisher;
    each generated token takes `token_delay`; `placement`: `--kv-placement`."""
    addresses = hosts(prefix, len(publishing))
    port, events, replay = (free_port_on_all(addresses) for _ in range(3))
    names = [chr(ord("a") + index) for index in range(len(publishing))]
    async with contextlib.AsyncExitStack() as stack:
        engines = {
            name: await stack.enter_async_context(
                running_engine(
                    _config(host, port, name, (events, replay) if on else None, token_delay)
                )
            )
            for name, host, on in zip(names, addresses, publishing, strict=True)
        }
        urls = [engine.url for engine in engines.values()]
        flags = _router_flags(urls, (events, replay), placement)
        router = await stack.enter_async_context(RouterProcess(flags))
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        )
        fleet = Fleet(router, engines, session)
        await wait_until(
            lambda: _states_are(fleet, dict.fromkeys(names, "ready"), field="state"),
            timeout=TIMEOUT,
            what="every engine ready",
        )
        yield fleet


def system_prompt(tag: str, blocks: int = 12) -> str:
    """A system prompt of many words, different for each `tag` from its first token."""
    rng = random.Random(tag)
    return f"{tag}: " + " ".join(f"w{rng.randrange(10**6)}" for _ in range(blocks * BLOCK))


def chat(system: str, question: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    }


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def warm_directly(fleet: Fleet, name: str, system: str) -> int:
    """Make `system` cached on engine `name` without the router; its cached prompt tokens."""
    engine = fleet.engine(name)
    await post(fleet.session, engine.url + "/v1/chat/completions", chat(system, "warm up"))
    truth = await post(fleet.session, engine.url + "/sim/kv-cache/predict", chat(system, "next"))
    assert truth["cached_tokens"] > 0
    return int(truth["cached_tokens"])


@dataclass(frozen=True)
class Receipt:
    engine: str
    predicted: int


async def via_router(fleet: Fleet, system: str, question: str) -> Receipt:
    """Send a chat through the router; which engine took it and the cached tokens it predicted."""
    url = fleet.router.url + "/v1/chat/completions"
    async with fleet.session.post(url, json=chat(system, question)) as response:
        assert response.status == 200, await response.text()
        await response.read()
        engine = response.headers["x-headcount-engine"]
        return Receipt(engine, int(response.headers["x-headcount-cached-tokens"]))


async def truth(fleet: Fleet, name: str, system: str, question: str) -> int:
    """The tokens engine `name` has cached for this chat now."""
    url = fleet.engine(name).url + "/sim/kv-cache/predict"
    return int((await post(fleet.session, url, chat(system, question)))["cached_tokens"])


async def fault(fleet: Fleet, name: str, **faults: object) -> None:
    await post(fleet.session, fleet.engine(name).url + "/sim/kv-events", dict(faults))


async def engine_views(fleet: Fleet) -> dict[str, dict[str, Any]]:
    """`/engines` by engine name (the engine's `--name`, its URL's host for the router)."""
    by_url = {engine.url: name for name, engine in fleet.engines.items()}
    views = await fleet.router.client.engines()
    return {by_url[view["url"]]: view for view in views if view["url"] in by_url}


async def _states_are(fleet: Fleet, wanted: dict[str, str], *, field: str = "kv") -> bool:
    views = await engine_views(fleet)
    if field == "state":
        return all(views.get(name, {}).get("state") == state for name, state in wanted.items())
    return all(
        views.get(name, {}).get("kv_index", {}).get("state") == state
        for name, state in wanted.items()
    )


async def holds_for(seconds: float, condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Assert `condition` at every poll for `seconds` (an invariant over time, not a wait)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        assert await condition(), f"{what} no longer held"


def name_of(fleet: Fleet, url: str) -> str:
    return next(name for name, engine in fleet.engines.items() if engine.url == url)


async def wait_for_kv(fleet: Fleet, what: str, **wanted: str) -> None:
    await wait_until(lambda: _states_are(fleet, wanted), timeout=TIMEOUT, what=what)


async def indexed_blocks(fleet: Fleet, name: str) -> int:
    return int((await engine_views(fleet))[name]["kv_index"]["blocks"])


async def wait_indexed(fleet: Fleet, name: str, blocks: int) -> None:
    async def enough() -> bool:
        return await indexed_blocks(fleet, name) >= blocks

    await wait_until(enough, timeout=TIMEOUT, what=f"{name}'s index to hold {blocks} blocks")


async def metric(fleet: Fleet, family: str, **labels: str) -> float:
    """The summed value of `family`'s samples whose labels include `labels` (0 if none)."""
    total = 0.0
    for each in text_string_to_metric_families(await fleet.router.client.metrics()):
        for sample in each.samples:
            if sample.name == family and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


# ------------------------------------------------------------------------- warm routing


async def test_warm_prompts_are_routed_to_the_engine_that_holds_them() -> None:
    async with kv_fleet(True, True) as fleet:
        await wait_for_kv(fleet, "both indexes synced", a="synced", b="synced")
        placed = {f"tenant-{n}": "ab"[n % 2] for n in range(6)}
        for tag, name in placed.items():
            cached = await warm_directly(fleet, name, system_prompt(tag))
            await wait_indexed(fleet, name, cached // BLOCK)
        for tag, name in placed.items():
            receipt = await via_router(fleet, system_prompt(tag), f"question for {tag}")
            assert receipt.engine == fleet.engine(name).url, tag
            assert receipt.predicted > 0, tag
        for tag, name in placed.items():
            question = f"another question for {tag}"
            expected = Receipt(
                fleet.engine(name).url, await truth(fleet, name, system_prompt(tag), question)
            )
            assert await via_router(fleet, system_prompt(tag), question) == expected


async def _placement(fleet: Fleet) -> dict[str, Any]:
    shown: dict[str, Any] = (await fleet.router.client.health()).get("kv_placement", {})
    return shown


async def test_with_placement_on_a_plan_is_built_on_synced_indexes_and_shown() -> None:
    async with kv_fleet(True, True, prefix="127.0.41", placement="on") as fleet:
        await wait_for_kv(fleet, "both indexes synced", a="synced", b="synced")
        for number in range(6):
            await via_router(fleet, system_prompt("tenant"), f"question {number}")

        async def used() -> bool:
            return bool((await _placement(fleet)).get("used"))

        await wait_until(used, timeout=TIMEOUT, what="a plan in use")
        shown = await _placement(fleet)
        assert shown["reason"] == "planned" and shown["age_s"] <= 6
        receipt = await via_router(fleet, system_prompt("tenant"), "one more question")
        assert receipt.engine in (fleet.engine("a").url, fleet.engine("b").url)
        assert (await fleet.router.client.health())["status"] == "ok"


# ------------------------------------------------------------------------- stream faults


async def test_a_gap_the_replay_fills_keeps_the_index_synced_and_complete() -> None:
    async with kv_fleet(True, True, prefix="127.0.6") as fleet:
        await wait_for_kv(fleet, "both indexes synced", a="synced", b="synced")
        await fault(fleet, "a", drop=2)
        tags = ["dropped-1", "dropped-2", "sent"]
        for tag in tags:
            await warm_directly(fleet, "a", system_prompt(tag))
        await wait_until(
            lambda: _at_least(fleet, "headcount_kv_replays_total", 1, outcome="filled"),
            timeout=TIMEOUT,
            what="a filled replay",
        )
        await wait_for_kv(fleet, "a synced after the replay", a="synced")
        assert await metric(fleet, "headcount_kv_index_clears_total") == 0
        for tag in tags:
            receipt = await via_router(fleet, system_prompt(tag), "and now?")
            assert receipt.engine == fleet.engine("a").url, tag


async def test_a_gap_the_replay_cannot_fill_clears_the_index_and_routing_heals() -> None:
    async with kv_fleet(True, True, prefix="127.0.7") as fleet:
        await wait_for_kv(fleet, "both indexes synced", a="synced", b="synced")
        await fault(fleet, "a", drop=2, replay=False)
        for tag in ("lost-1", "lost-2", "seen"):
            await warm_directly(fleet, "a", system_prompt(tag))
        await wait_until(
            lambda: _at_least(fleet, "headcount_kv_index_clears_total", 1, reason="gap"),
            timeout=TIMEOUT,
            what="the index cleared for an unfillable gap",
        )
        assert await metric(fleet, "headcount_kv_replays_total", outcome="failed") >= 1
        state = (await engine_views(fleet))["a"]["kv_index"]["state"]
        assert state in ("rebuilding", "synced")
        await fault(fleet, "a", replay=True)
        cached = await warm_directly(fleet, "a", system_prompt("after"))
        await wait_indexed(fleet, "a", cached // BLOCK)
        expected = Receipt(
            fleet.engine("a").url, await truth(fleet, "a", system_prompt("after"), "healed?")
        )
        assert await via_router(fleet, system_prompt("after"), "healed?") == expected


async def test_repeated_cached_prompts_with_short_answers_keep_every_index_synced() -> None:
    """A request that only hits the cache stores no block and sends no event: no alarm. The
    first one's batch arrives before its answer (decoding takes time)."""
    async with kv_fleet(True, True, prefix="127.0.14", token_delay=0.05) as fleet:
        await wait_for_kv(fleet, "both indexes synced", a="synced", b="synced")
        system = system_prompt("repeat")
        question = "the same short question"
        first = await via_router(fleet, system, question)
        name = name_of(fleet, first.engine)
        await wait_indexed(fleet, name, await truth(fleet, name, system, question) // BLOCK)
        synced = functools.partial(_states_are, fleet, {"a": "synced", "b": "synced"})

        async def still_cached_and_synced() -> bool:
            receipt = await via_router(fleet, system, question)
            assert receipt.engine == first.engine and receipt.predicted > 0, receipt
            return await synced()

        await holds_for(2 * IDLE_TIMEOUT, still_cached_and_synced, "repeats cached, all synced")
        assert (await fleet.router.client.health())["status"] == "ok"


async def test_a_new_prompt_then_quiet_keeps_the_index_synced_and_used() -> None:
    """The engine's batch arrives before its answer (decoding takes time); no later one."""
    async with kv_fleet(True, True, prefix="127.0.15", token_delay=0.1) as fleet:
        await wait_for_kv(fleet, "both indexes synced", a="synced", b="synced")
        system = system_prompt("quiet")
        first = await via_router(fleet, system, "a new question")
        name = name_of(fleet, first.engine)
        cached = await truth(fleet, name, system, "next")
        await wait_indexed(fleet, name, cached // BLOCK)
        synced = functools.partial(_states_are, fleet, {"a": "synced", "b": "synced"})
        await holds_for(2 * IDLE_TIMEOUT, synced, "both indexes synced while quiet")
        assert await via_router(fleet, system, "next") == Receipt(first.engine, cached)


async def test_a_publisher_that_does_not_answer_turns_stale_is_logged_and_recovers() -> None:
    async with kv_fleet(True, True, prefix="127.0.8") as fleet:
        await wait_for_kv(fleet, "both indexes synced", a="synced", b="synced")
        cached = await warm_directly(fleet, "a", system_prompt("hot"))
        await wait_indexed(fleet, "a", cached // BLOCK)
        await fault(fleet, "a", silent=True, replay=False)
        await wait_for_kv(fleet, "a stale after its idle timeout", a="stale")
        health = await fleet.router.client.health()
        assert health["status"] == "degraded"
        assert "no answer to the liveness check" in json.dumps(health)
        for n in range(4):
            receipt = await via_router(fleet, system_prompt("hot"), f"while stale {n}")
            assert receipt.predicted == 0 or receipt.engine != fleet.engine("a").url
        await fault(fleet, "a", silent=False, replay=True)
        await wait_for_kv(fleet, "a synced again", a="synced")
        assert (await fleet.router.client.health())["status"] == "ok"
        log = fleet.router.log_path.read_text()
        assert log.count("no answer to the liveness check within 1s: the stream cannot be") == 1
        assert "answers again" in log


async def test_batches_withheld_then_quiet_are_found_by_the_liveness_check() -> None:
    async with kv_fleet(True, True, prefix="127.0.16") as fleet:
        await wait_for_kv(fleet, "both indexes synced", a="synced", b="synced")
        await fault(fleet, "a", silent=True)
        cached = await warm_directly(fleet, "a", system_prompt("withheld"))
        await wait_indexed(fleet, "a", cached // BLOCK)
        assert await _at_least(fleet, "headcount_kv_event_gaps_total", 1)
        receipt = await via_router(fleet, system_prompt("withheld"), "next")
        assert receipt == Receipt(fleet.engine("a").url, cached)


async def test_an_engine_restart_clears_its_index() -> None:
    async with kv_fleet(True, True, prefix="127.0.9") as fleet:
        await wait_for_kv(fleet, "both indexes synced", a="synced", b="synced")
        cached = await warm_directly(fleet, "a", system_prompt("before"))
        await wait_indexed(fleet, "a", cached // BLOCK)
        await fault(fleet, "a", restart=True)
        await warm_directly(fleet, "a", system_prompt("after-restart"))
        await wait_until(
            lambda: _at_least(fleet, "headcount_kv_index_clears_total", 1, reason="restart"),
            timeout=TIMEOUT,
            what="the index cleared for the restart",
        )
        await wait_for_kv(fleet, "a synced after the restart", a="synced")
        assert await truth(fleet, "a", system_prompt("before"), "q") == 0
        receipt = await via_router(fleet, system_prompt("before"), "q")
        assert receipt.predicted == 0


async def test_an_engine_without_a_publisher_is_off_and_routed_by_load() -> None:
    async with kv_fleet(True, False, prefix="127.0.10") as fleet:
        await wait_for_kv(fleet, "a synced, b off", a="synced", b="off")
        health = await fleet.router.client.health()
        assert health["status"] == "degraded"
        assert fleet.engine("b").url in json.dumps(health) or "off" in json.dumps(health)
        engines = {(await via_router(fleet, system_prompt(f"t{n}"), "q")).engine for n in range(8)}
        assert engines == {fleet.engine("a").url, fleet.engine("b").url}
        unreached = f"no publisher reached at tcp://{fleet.engine('b').config.host}:"
        await wait_until(
            lambda: unreached in fleet.router.log_path.read_text(),
            timeout=TIMEOUT,
            what="the publisher not reached logged",
        )


async def test_an_engine_removed_by_discovery_leaves_no_index_behind(tmp_path: Path) -> None:
    addresses = hosts("127.0.11", 2)
    unused, events, replay = (free_port_on_all(addresses) for _ in range(3))
    annotations = {"kv-events-port": str(events), "kv-events-replay-port": str(replay)}
    async with (
        sim_cluster(tmp_path, addresses) as cluster,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session,
    ):
        for name, host in zip(("pod-a", "pod-b"), addresses, strict=True):
            config = _config(host, cluster.port, name, (events, replay))
            cluster.engines[name] = await start_engine(config)
            cluster.apply_pod(name, host, model=MODEL, annotations=annotations)
        flags = dataclasses.replace(
            cluster.router_flags(Timings(probe_interval=0.2, drain_delay=0)),
            routing=RoutingName.KV_AWARE,
            tokenizer="builtin",
            kv_events_port=unused,
        )
        async with RouterProcess(flags) as router:
            fleet = Fleet(router, cluster.engines, session)

            async def kv_states() -> dict[str, str | None]:
                views = await router.client.engines()
                return {view["name"]: view.get("kv_index", {}).get("state") for view in views}

            async def pods_synced() -> bool:
                return await kv_states() == {"default/pod-a": "synced", "default/pod-b": "synced"}

            await wait_until(pods_synced, timeout=TIMEOUT, what="both pods' indexes synced")
            await warm_directly(fleet, "pod-a", system_prompt("gone-soon"))
            await wait_until(
                lambda: _at_least(fleet, "headcount_kv_index_blocks", 1, engine="default/pod-a"),
                timeout=TIMEOUT,
                what="pod-a's blocks indexed",
            )
            cluster.api.delete_pod(cluster.namespace, "pod-a")

            async def forgotten() -> bool:
                text = await router.client.metrics()
                return "default/pod-a" not in text and "default/pod-b" in text

            await wait_until(forgotten, timeout=TIMEOUT, what="pod-a's series gone")
            assert await kv_states() == {"default/pod-b": "synced"}


async def _at_least(fleet: Fleet, family: str, value: float, **labels: str) -> bool:
    return await metric(fleet, family, **labels) >= value
