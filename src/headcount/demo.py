"""`headcount demo`: the incident headcount exists to prevent, replayed on a simulated cluster.

An emulated API server holds three engine pods (simulated engines on
127.0.0.11-13), and a real `headcount serve --discovery k8s-pods` process
routes live traffic to them. Act 1 is steady traffic; in act 2 an engine dies
before Kubernetes notices (failover, then the pod is deleted); in act 3 the
router is blinded (the API server refuses connections), a pod is deleted and
its engine stopped while it cannot see, and the API comes back: the ghost
disappears, with the time to truth measured and no request failed. A live
table shows the router's own view (`/engines`, `/health`) throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
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

from headcount.sim.apiserver import ApiServerSim, ApiServerSimConfig, make_pod, running_apiserver
from headcount.sim.engine import EngineSimConfig, SimEngine, start_engine
from headcount.sim.loopback import free_port_on_all

__all__ = ["run_demo"]

NAMESPACE = "demo"
MODEL = "sim-model"
ENGINE_HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
WORKERS = 6
MAX_REQUESTS = 20_000
_TIMEOUT = aiohttp.ClientTimeout(total=10)


@dataclass
class _Traffic:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    """No answer, or an error status: what failover exists to prevent."""
    cut: int = 0
    """Answers an engine had begun and then died in: never retried, by design."""
    errors: list[str] = field(default_factory=list)


@dataclass
class _View:
    act: str = "starting"
    story: list[str] = field(default_factory=list)
    engines: list[dict[str, Any]] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)

    def say(self, line: str) -> None:
        self.story.append(f"{time.strftime('%H:%M:%S')}  {line}")


async def _send(session: aiohttp.ClientSession, url: str, stream: bool, traffic: _Traffic) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8,
        "stream": stream,
    }
    traffic.sent += 1
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            try:
                payload = await response.read()
            except aiohttp.ClientPayloadError:
                traffic.cut += 1
                return
            if response.status == 200 and (not stream or payload.endswith(b"data: [DONE]\n\n")):
                traffic.ok += 1
                return
            traffic.errors.append(f"HTTP {response.status}: {payload[:120]!r}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        traffic.errors.append(repr(exc))
    traffic.failed += 1


async def _load(url: str, traffic: _Traffic, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:

        async def worker(index: int) -> None:
            stream = index % 2 == 0
            while not stop.is_set() and traffic.sent < MAX_REQUESTS:
                await _send(session, url, stream, traffic)
                await asyncio.sleep(0.02)

        await asyncio.gather(*(worker(i) for i in range(WORKERS)))


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        return await response.json(content_type=None)


async def _observe(url: str, view: _View, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while not stop.is_set():
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                view.engines = (await _get_json(session, url + "/engines"))["engines"]
                view.health = await _get_json(session, url + "/health")
            await asyncio.sleep(0.2)


def _render(view: _View, traffic: _Traffic) -> Group:
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
        f"   cut by a crashing engine {traffic.cut}",
        style="bold red" if traffic.failed else "bold",
    )
    story = Panel("\n".join(view.story[-9:]), title=f"act: {view.act}")
    return Group(table, health, counts, story)


async def _start_router(
    kubeconfig: Path, engine_port: int, log_path: Path
) -> tuple[asyncio.subprocess.Process, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = log_path.open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "headcount.cli",
        "serve",
        "--discovery=k8s-pods",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={NAMESPACE}",
        "--label-selector=app=engine",
        f"--engine-port={engine_port}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--probe-interval=1",
        "--watch-idle-timeout=5",
        "--discovery-stale-after=3",
        "--backoff-max=1",
        "--api-request-timeout=2",
        "--drain-delay=0",
        stdout=log,
        stderr=log,
    )
    log.close()
    return process, f"http://127.0.0.1:{port}"


async def _wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return False


def _listed(view: _View, name: str) -> bool:
    return any(engine["name"] == f"{NAMESPACE}/{name}" for engine in view.engines)


def _ready_count(view: _View) -> int:
    return sum(1 for engine in view.engines if engine["state"] == "ready")


@contextlib.asynccontextmanager
async def _cluster() -> AsyncIterator[tuple[ApiServerSim, list[SimEngine], int]]:
    port = free_port_on_all(ENGINE_HOSTS)
    async with running_apiserver(ApiServerSimConfig(bookmark_interval=1.0)) as api:
        engines = [
            await start_engine(
                EngineSimConfig(host=host, port=port, model=MODEL, token_delay=0.005, name=name)
            )
            for host, name in zip(ENGINE_HOSTS, ("engine-a", "engine-b", "engine-c"), strict=True)
        ]
        try:
            for engine, host in zip(engines, ENGINE_HOSTS, strict=True):
                api.apply_pod(
                    make_pod(
                        engine.name,
                        namespace=NAMESPACE,
                        labels={"app": "engine", "model": MODEL},
                        ip=host,
                        port=port,
                    )
                )
            yield api, engines, port
        finally:
            for engine in engines:
                await engine.stop()


async def _failovers(url: str) -> int:
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        async with session.get(url + "/metrics") as response:
            text = await response.text()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("headcount_upstream_failovers_total")
        )
    )


async def _story(
    api: ApiServerSim, engines: list[SimEngine], url: str, view: _View, act_seconds: float
) -> float | None:
    view.act = "1. steady traffic"
    view.say("three engine pods, router in k8s-pods mode, mixed streaming traffic")
    await asyncio.sleep(act_seconds)

    view.act = "2. an engine dies before Kubernetes notices"
    await engines[1].set_fail_mode("refuse")
    view.say("engine-b crashes: answers it had begun are cut; its pod still says Ready")
    await asyncio.sleep(act_seconds / 2)
    view.say("requests to engine-b fail over before the first byte; it leaves rotation")
    api.delete_pod(NAMESPACE, "engine-b")
    view.say("Kubernetes deletes pod engine-b: the watch removes it")
    await _wait_for(lambda: not _listed(view, "engine-b"), 5)
    await asyncio.sleep(act_seconds / 2)

    view.act = "3. blind: the API server refuses, a pod is deleted meanwhile"
    await api.refuse()
    view.say("API server refuses connections: the router is blind")
    await asyncio.sleep(1.0)
    api.delete_pod(NAMESPACE, "engine-c")
    await engines[2].drain()
    view.say("pod engine-c deleted; its engine finished its requests and exited, unseen")
    view.say("(a router that re-watches without re-listing keeps this ghost forever)")
    await asyncio.sleep(act_seconds)
    await api.restore()
    restored = time.monotonic()
    view.say("API server reachable again")
    if await _wait_for(lambda: not _listed(view, "engine-c"), 15):
        truth = time.monotonic() - restored
        view.say(f"ghost engine-c gone {truth:.2f} s after the API came back (re-list)")
        await asyncio.sleep(act_seconds / 2)
        return truth
    view.say("ghost engine-c still listed after 15 s: headcount failed its promise")
    return None


async def run_demo(ns: argparse.Namespace) -> None:
    """Run the three acts and print the summary; exits by itself."""
    act_seconds = ns.duration if ns.duration is not None else 5.0
    console = Console()
    view, traffic = _View(), _Traffic()
    with tempfile.TemporaryDirectory(prefix="headcount-demo-") as tmp:
        async with _cluster() as (api, engines, engine_port):
            kubeconfig = api.kubeconfig(Path(tmp) / "kubeconfig", namespace=NAMESPACE)
            log_path = Path(tmp) / "router.log"
            router, url = await _start_router(kubeconfig, engine_port, log_path)
            stop = asyncio.Event()
            observer = asyncio.create_task(_observe(url, view, stop))
            try:
                if not await _wait_for(lambda: _ready_count(view) == 3, 20):
                    console.print("[red]the router did not become ready; its log:[/red]")
                    console.print(log_path.read_text()[-3000:])
                    return
                load = asyncio.create_task(_load(url, traffic, stop))
                with Live(_render(view, traffic), console=console, refresh_per_second=8) as live:
                    story = asyncio.create_task(_story(api, engines, url, view, act_seconds))
                    while not story.done():
                        live.update(_render(view, traffic))
                        await asyncio.sleep(0.125)
                    stop.set()
                    await load
                    live.update(_render(view, traffic))
                truth = story.result()
                failovers = await _failovers(url)
            finally:
                stop.set()
                observer.cancel()
                with contextlib.suppress(ProcessLookupError):
                    router.send_signal(signal.SIGTERM)
                await asyncio.wait_for(router.wait(), 30)
    _summary(console, traffic, failovers, truth)


def _summary(console: Console, traffic: _Traffic, failovers: int, truth: float | None) -> None:
    summary = Table(title="summary", show_header=False)
    summary.add_row("requests sent", str(traffic.sent))
    summary.add_row("requests failed", str(traffic.failed))
    summary.add_row("failed over (before the first byte)", str(failovers))
    summary.add_row("cut mid-answer by the crashing engine (never retried)", str(traffic.cut))
    summary.add_row(
        "time to truth after the API came back",
        f"{truth:.2f} s" if truth is not None else "never (bug)",
    )
    console.print(summary)
    for error in traffic.errors[:5]:
        console.print(f"[red]failure:[/red] {error}")
