"""A simulated Kubernetes cluster for scenario tests that run the router as a real process.

The API server emulator runs on the test's event loop; each engine pod gets
its own loopback IP (127.0.0.0/8 all routes to `lo`) and every engine listens
on one shared port, as pods do. The router is started with `router_args()`:
`--discovery k8s-pods` on the cluster's kubeconfig and timings small enough
for a test to watch it recover within seconds::

    async with sim_cluster(tmp_path, hosts("127.0.1", 3)) as cluster:
        await cluster.add_engine("a", "127.0.1.1", model="model-a")
        async with RouterProcess(cluster.router_args()) as router:
            await wait_until_async(lambda: routable(router, "model-a"))

`truth()` says which pods must be engines, computed here from the pod
objects, independently of the router's own mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from headcount.sim.apiserver import ApiServerSim, ApiServerSimConfig, make_pod, running_apiserver
from headcount.sim.engine import EngineSimConfig, SimEngine, start_engine
from headcount.sim.loopback import free_port_on_all

__all__ = [
    "NAMESPACE",
    "ROUTER_TIMINGS",
    "SELECTOR",
    "Blackhole",
    "SimCluster",
    "Traffic",
    "chat",
    "engines_by_name",
    "hosts",
    "metric_value",
    "routable",
    "sim_cluster",
    "steady_traffic",
]

NAMESPACE = "llm"
SELECTOR = {"app": "engine"}
"""Labels every engine pod carries; the router selects `app=engine`."""

ROUTER_TIMINGS = [
    "--probe-interval=0.5",
    "--backoff-initial=0.05",
    "--backoff-max=0.5",
    "--api-request-timeout=1",
    "--api-connect-timeout=0.5",
    "--watch-idle-timeout=2",
    "--connect-timeout=0.3",
    "--discovery-stale-after=2",
    "--drain-delay=0",
    "--drain-timeout=2",
]
"""Small enough for a test to see recoveries within seconds; the idle timeout is 4 bookmarks."""

_CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=3)


def hosts(prefix: str, count: int) -> list[str]:
    """`count` loopback addresses: `hosts("127.0.1", 3)` is 127.0.1.1 to 127.0.1.3."""
    return [f"{prefix}.{n}" for n in range(1, count + 1)]


def _is_engine_pod(pod: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    """The truth a router must converge to, restated from DESIGN.md rather than imported."""
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


@dataclass
class SimCluster:
    """The emulator, the engines started for its pods, and the router's command line."""

    api: ApiServerSim
    port: int
    """The engine port, free on every address the cluster was made for."""
    kubeconfig: Path
    engines: dict[str, SimEngine] = field(default_factory=dict)
    """By the name they were started under (usually their pod's)."""

    def router_args(self, *extra: str) -> list[str]:
        return [
            "--discovery=k8s-pods",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={NAMESPACE}",
            "--label-selector=app=engine",
            f"--engine-port={self.port}",
            *ROUTER_TIMINGS,
            *extra,
        ]

    async def start_engine(self, name: str, host: str, *, model: str) -> SimEngine:
        """A simulated engine on `host` and the cluster's port, stopped with the cluster."""
        engine = await start_engine(
            EngineSimConfig(host=host, port=self.port, model=model, name=name)
        )
        self.engines[name] = engine
        return engine

    def apply_pod(
        self,
        name: str,
        ip: str | None,
        *,
        model: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        ready: bool = True,
    ) -> dict[str, Any]:
        """Create or replace an engine pod (selected, labelled with `model` if given)."""
        all_labels = {**SELECTOR, **({"model": model} if model else {}), **(labels or {})}
        pod = make_pod(
            name,
            namespace=NAMESPACE,
            labels=all_labels,
            annotations=annotations,
            ip=ip,
            ready=ready,
            port=self.port,
        )
        return self.api.apply_pod(pod)

    async def add_engine(self, name: str, host: str, *, model: str) -> SimEngine:
        """An engine on `host` and a Ready pod for it, named `name`."""
        engine = await self.start_engine(name, host, model=model)
        self.apply_pod(name, host, model=model)
        return engine

    def uid(self, name: str) -> str:
        pod = self.api.get("Pod", NAMESPACE, name)
        assert pod is not None, f"no pod {name}"
        return str(pod["metadata"]["uid"])

    def truth(self) -> set[str]:
        """UIDs of the pods that must be engines: selected, Running, Ready, an IP, not deleting."""
        return {
            str(pod["metadata"]["uid"])
            for pod in self.api.pods(NAMESPACE)
            if _is_engine_pod(pod, SELECTOR)
        }


@contextlib.asynccontextmanager
async def sim_cluster(
    tmp_path: Path, addresses: Iterable[str], *, bookmark_interval: float = 0.5
) -> AsyncIterator[SimCluster]:
    """An emulator and an engine port free on all `addresses`; engines stop on exit."""
    port = free_port_on_all(addresses)
    async with running_apiserver(ApiServerSimConfig(bookmark_interval=bookmark_interval)) as api:
        cluster = SimCluster(api, port, api.kubeconfig(tmp_path / "kubeconfig", NAMESPACE))
        try:
            yield cluster
        finally:
            for engine in cluster.engines.values():
                await engine.stop()


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


# --- the router, seen from outside -------------------------------------------------------------


async def engines_by_name(router_url: str) -> dict[str, dict[str, Any]]:
    """The router's `/engines`, keyed by pod name (without the namespace)."""
    async with aiohttp.ClientSession(timeout=_CLIENT_TIMEOUT) as session:
        async with session.get(router_url + "/engines") as response:
            body = await response.json(content_type=None)
    return {engine["name"].split("/", 1)[1]: engine for engine in body["engines"]}


async def chat(router_url: str, model: str) -> tuple[int, dict[str, Any]]:
    """One non-streaming chat request through the router: status and JSON body."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with aiohttp.ClientSession(timeout=_CLIENT_TIMEOUT) as session:
        async with session.post(router_url + "/v1/chat/completions", json=body) as response:
            return response.status, await response.json(content_type=None)


async def routable(router_url: str, model: str) -> bool:
    """Whether a request for `model` succeeds now."""
    status, _ = await chat(router_url, model)
    return status == 200


async def metric_value(router_url: str, name: str) -> float:
    """The sum of every sample of metric `name` on the router's `/metrics`."""
    async with aiohttp.ClientSession(timeout=_CLIENT_TIMEOUT) as session:
        async with session.get(router_url + "/metrics") as response:
            text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ")
    )


@dataclass
class Traffic:
    """What a background traffic loop saw: every request's outcome, failures spelled out."""

    sent: int = 0
    ok: int = 0
    failures: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def steady_traffic(
    router_url: str,
    model: str,
    *,
    every: float = 0.05,
    max_requests: int = 400,
    max_seconds: float = 30.0,
) -> AsyncIterator[Traffic]:
    """A non-streaming chat request sent every `every` seconds while in the block.

    Requests start on the tick whether or not the previous one has ended; each
    has a client timeout, and the loop is bounded by `max_requests` and
    `max_seconds`. Leaving the block waits for the requests still in flight.
    """
    traffic = Traffic()
    stop = asyncio.Event()
    deadline = time.monotonic() + max_seconds

    async def send_one(session: aiohttp.ClientSession, number: int) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        try:
            async with session.post(router_url + "/v1/chat/completions", json=body) as response:
                payload = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            traffic.failures.append(f"request {number}: {exc!r}")
            return
        if response.status == 200:
            traffic.ok += 1
        else:
            traffic.failures.append(f"request {number}: {response.status} {payload[:200]!r}")

    async def tick() -> None:
        async with aiohttp.ClientSession(timeout=_CLIENT_TIMEOUT) as session:
            requests: list[asyncio.Task[None]] = []
            while not stop.is_set() and traffic.sent < max_requests:
                if time.monotonic() > deadline:
                    break
                traffic.sent += 1
                requests.append(asyncio.create_task(send_one(session, traffic.sent)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), every)
            await asyncio.gather(*requests)

    task = asyncio.create_task(tick())
    try:
        yield traffic
    finally:
        stop.set()
        await task
