"""`headcount demo`: the incident headcount exists to prevent, replayed on a simulated cluster.

An emulated API server holds three engine pods (simulated engines on
127.0.0.11-13), and a real `headcount serve --discovery k8s-pods` process
routes live traffic to them. Act 1 is steady traffic; in act 2 an engine dies
before Kubernetes notices (the streams it was sending resume on the others,
new requests fail over, then the pod is deleted); in act 3 the
router is blinded (the API server refuses connections), a pod is deleted and
its engine stopped while it cannot see, and the API comes back: the ghost
disappears, with the time to truth measured and no request failed. A live
table shows the router's own view (`/engines`, `/health`) throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from headcount.sim.cluster import (
    RouterClient,
    RouterProcess,
    SimCluster,
    Timings,
    Traffic,
    sim_cluster,
    steady_traffic,
    wait_until,
)

__all__ = ["run_demo"]

NAMESPACE = "demo"
MODEL = "sim-model"
ENGINES = {"engine-a": "127.0.0.11", "engine-b": "127.0.0.12", "engine-c": "127.0.0.13"}
"""Pod name -> pod IP, where its simulated engine listens."""
TOKEN_DELAY = 0.005
REQUEST_EVERY = 0.011
"""About 90 requests a second at random moments (so a draining engine finds an idle one),
every other one streamed."""
MAX_REQUESTS = 20_000
TIMINGS = Timings(
    probe_interval=1,
    watch_idle_timeout=5,
    discovery_stale_after=3,
    backoff_max=1,
    api_request_timeout=2,
    drain_delay=0,
)


@dataclass
class _View:
    act: str = "starting"
    story: list[str] = field(default_factory=list)
    engines: list[dict[str, Any]] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)

    def say(self, line: str) -> None:
        self.story.append(f"{time.strftime('%H:%M:%S')}  {line}")


@contextlib.asynccontextmanager
async def _observing(url: str, view: _View) -> AsyncIterator[None]:
    """Keeps `view` showing the router's `/engines` and `/health` while in the block."""
    client = RouterClient(url, timeout=2.0)

    async def observe() -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                view.engines = await client.engines()
                view.health = await client.health()
            await asyncio.sleep(0.2)

    observer = asyncio.create_task(observe())
    try:
        yield
    finally:
        observer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await observer


def _render(view: _View, traffic: Traffic) -> Group:
    table = Table(title="the router's view (GET /engines)", expand=True)
    for column in ("engine", "url", "state", "in flight", "served", "last error"):
        table.add_column(column, overflow="fold")
    colours = {"ready": "green", "unhealthy": "red", "pending": "yellow", "sleeping": "blue"}
    for engine in view.engines:
        state = engine["state"]
        table.add_row(
            engine["name"],
            engine["url"],
            Text(state, style=colours.get(state, "white")),
            str(engine["in_flight"]),
            str(engine["requests"]),
            (engine.get("last_error") or "")[:48],
        )
    status = view.health.get("status", "?")
    sources = view.health.get("sources", [{}])
    source = sources[0] if sources else {}
    health_colour = {"ok": "green", "degraded": "yellow", "unavailable": "red"}.get(status, "white")
    health = Text.assemble(
        ("health: ", "bold"),
        (status, f"bold {health_colour}"),
        f"   watch connected: {source.get('watch_connected')}",
        f"   last sync {source.get('last_list_age_seconds')} s / "
        f"last event {source.get('last_event_age_seconds')} s ago",
        f"   relist removals: {source.get('removed_by_relist')}",
    )
    counts = Text(
        f"requests sent {traffic.sent}   ok {traffic.ok}   failed {traffic.failed}"
        f"   cut mid-answer {traffic.cut}",
        style="bold red" if traffic.failed else "bold",
    )
    story = Panel("\n".join(view.story[-9:]), title=f"act: {view.act}")
    return Group(table, health, counts, story)


def _listed(view: _View, name: str) -> bool:
    return any(engine["name"] == f"{NAMESPACE}/{name}" for engine in view.engines)


def _ready_count(view: _View) -> int:
    return sum(1 for engine in view.engines if engine["state"] == "ready")


async def _story(cluster: SimCluster, view: _View, act_seconds: float) -> float | None:
    view.act = "1. steady traffic"
    view.say("three engine pods, router in k8s-pods mode, mixed streaming traffic")
    await asyncio.sleep(act_seconds)

    view.act = "2. an engine dies before Kubernetes notices"
    await cluster.engines["engine-b"].set_fail_mode("refuse")
    view.say("engine-b crashes: the streams it was sending resume on the others")
    view.say("its pod still says Ready")
    await asyncio.sleep(act_seconds / 2)
    view.say("requests to engine-b fail over before the first byte; it leaves rotation")
    cluster.api.delete_pod(NAMESPACE, "engine-b")
    view.say("Kubernetes deletes pod engine-b: the watch removes it")
    with contextlib.suppress(TimeoutError):
        await wait_until(lambda: not _listed(view, "engine-b"), timeout=5)
    await asyncio.sleep(act_seconds / 2)

    view.act = "3. blind: the API server refuses, a pod is deleted meanwhile"
    await cluster.api.refuse()
    view.say("API server refuses connections: the router is blind")
    await asyncio.sleep(1.0)
    cluster.api.delete_pod(NAMESPACE, "engine-c")
    await cluster.engines["engine-c"].drain()
    view.say("pod engine-c deleted; its engine finished its requests and exited, unseen")
    view.say("(a router that re-watches without re-listing keeps this ghost forever)")
    await asyncio.sleep(act_seconds)
    await cluster.api.restore()
    restored = time.monotonic()
    view.say("API server reachable again")
    try:
        await wait_until(lambda: not _listed(view, "engine-c"), timeout=15)
    except TimeoutError:
        view.say("ghost engine-c still listed after 15 s: headcount failed its promise")
        return None
    truth = time.monotonic() - restored
    view.say(f"ghost engine-c gone {truth:.2f} s after the API came back (re-list)")
    await asyncio.sleep(act_seconds / 2)
    return truth


async def _play(
    cluster: SimCluster, url: str, view: _View, console: Console, act_seconds: float
) -> tuple[Traffic, float | None]:
    """The three acts under live traffic, the table redrawn as they go."""
    with Live(console=console, refresh_per_second=8) as live:
        async with steady_traffic(
            url,
            MODEL,
            every=REQUEST_EVERY,
            poisson=True,
            stream_every=2,
            max_tokens=24,
            timeout=10.0,
            max_requests=MAX_REQUESTS,
            max_seconds=4 * act_seconds + 30,
        ) as traffic:
            story = asyncio.create_task(_story(cluster, view, act_seconds))
            while not story.done():
                live.update(_render(view, traffic))
                await asyncio.sleep(0.125)
        live.update(_render(view, traffic))
    return traffic, story.result()


async def run_demo(ns: argparse.Namespace) -> None:
    """Run the three acts and print the summary; exits by itself."""
    act_seconds = ns.duration if ns.duration is not None else 5.0
    console = Console()
    view = _View()
    with tempfile.TemporaryDirectory(prefix="headcount-demo-") as tmp:
        workdir = Path(tmp)
        async with sim_cluster(
            workdir, ENGINES.values(), namespace=NAMESPACE, bookmark_interval=1.0
        ) as cluster:
            for name, host in ENGINES.items():
                await cluster.add_engine(name, host, model=MODEL, token_delay=TOKEN_DELAY)
            router = RouterProcess(
                cluster.router_flags(TIMINGS), log_path=workdir / "router.log", ready_timeout=20
            )
            async with contextlib.AsyncExitStack() as running:
                try:
                    await running.enter_async_context(router)
                    await running.enter_async_context(_observing(router.url, view))
                    await wait_until(lambda: _ready_count(view) == len(ENGINES), timeout=20)
                except TimeoutError:
                    console.print("[red]the router did not become ready; its log:[/red]")
                    console.print(router.log()[-3000:])
                    return
                traffic, truth = await _play(cluster, router.url, view, console, act_seconds)
                client = router.client
                failovers = await client.metric_value("headcount_upstream_failovers_total")
                resumed = await client.metric_value(
                    "headcount_stream_resumes_total", 'outcome="resumed"'
                )
    _summary(console, traffic, int(failovers), int(resumed), truth)


def _summary(
    console: Console, traffic: Traffic, failovers: int, resumed: int, truth: float | None
) -> None:
    summary = Table(title="summary", show_header=False)
    summary.add_row("requests sent", str(traffic.sent))
    summary.add_row("requests failed", str(traffic.failed))
    summary.add_row("failed over (before the first byte)", str(failovers))
    summary.add_row("resumed on another engine (mid-answer)", str(resumed))
    summary.add_row("cut mid-answer", str(traffic.cut))
    summary.add_row(
        "time to truth after the API came back",
        f"{truth:.2f} s" if truth is not None else "never (bug)",
    )
    console.print(summary)
    for failure in traffic.failures[:5]:
        console.print(f"[red]failure:[/red] {failure}")
