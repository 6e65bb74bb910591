"""A running emulator, as tests hold it: its address, its objects and the faults it can inject.

This is the Python API (`ApiServerSim`, `start_apiserver`, `running_apiserver`);
the parts it ties together each live in their own module.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path

from headcount.sim.apiserver import writes
from headcount.sim.apiserver.app import build_admin_app, build_app
from headcount.sim.apiserver.config import ApiServerSimConfig
from headcount.sim.apiserver.faults import Faults
from headcount.sim.apiserver.kubelet import Kubelet
from headcount.sim.apiserver.listener import Listener
from headcount.sim.apiserver.objects import JsonObject
from headcount.sim.apiserver.resources import BY_KIND, ENDPOINTSLICES, PODS, SERVICES, Kind
from headcount.sim.apiserver.store import Store
from headcount.sim.apiserver.watch import end_watches

__all__ = ["ApiServerSim", "running_apiserver", "start_apiserver"]


class ApiServerSim:
    """A running emulator: its address, its objects and the faults it can inject.

    Start it with `start_apiserver` or `running_apiserver`. The methods are not
    thread-safe: call them on the loop that runs the server.
    """

    def __init__(self, config: ApiServerSimConfig) -> None:
        self.config = config
        self._store = Store(config.history_size)
        self._listener = Listener(config.host, config.port)
        self._faults = Faults(self._store, self._listener)
        self._kubelet = (
            Kubelet(self._store, config.kubelet_addresses, config.kubelet_delay, asyncio.sleep)
            if config.kubelet
            else None
        )
        if self._kubelet is not None:
            self._store.observers.append(self._kubelet.observe)
        self._admin = (
            None if config.admin_port is None else Listener(config.host, config.admin_port)
        )

    @property
    def port(self) -> int:
        """The port listened on: the one picked when `config.port` is 0."""
        return self._listener.port

    @property
    def url(self) -> str:
        return _url(self.config.host, self.port)

    @property
    def admin_url(self) -> str | None:
        """Where the admin port serves ``/_sim/`` whatever the faults, if it has one."""
        return None if self._admin is None else _url(self.config.host, self._admin.port)

    @property
    def resource_version(self) -> int:
        """The global resourceVersion: that of the latest change."""
        return self._store.resource_version

    @property
    def open_watches(self) -> int:
        """Watch streams open now, stalled ones included."""
        return len(self._store.watches)

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """Write a kubeconfig for this server (plain HTTP, a dummy token) and return its path.

        It is JSON, which every YAML reader takes: kubernetes, kubernetes_asyncio, kubectl.
        """
        name = "headcount-sim"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {"token": "headcount-sim"}}],
            "contexts": [
                {"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}
            ],
            "current-context": name,
            "preferences": {},
        }
        path.write_text(json.dumps(config, indent=2) + "\n")
        return path

    # objects

    def apply(self, obj: JsonObject) -> JsonObject:
        """Create or replace an object whose ``kind`` says what it is; return it as stored.

        Replacing keeps uid and creationTimestamp; one that changes nothing is no event.
        """
        return writes.apply(self._store, obj)

    def apply_pod(self, pod: JsonObject) -> JsonObject:
        """`apply` for a Pod, e.g. ``sim.apply_pod(make_pod("engine-0", ready=False))``."""
        return writes.apply_as(self._store, PODS, pod)

    def apply_service(self, service: JsonObject) -> JsonObject:
        """`apply` for a Service."""
        return writes.apply_as(self._store, SERVICES, service)

    def apply_endpointslice(self, endpoint_slice: JsonObject) -> JsonObject:
        """`apply` for an EndpointSlice."""
        return writes.apply_as(self._store, ENDPOINTSLICES, endpoint_slice)

    def patch(self, kind: Kind, namespace: str, name: str, patch: JsonObject) -> JsonObject:
        """Apply a JSON merge patch, e.g. ``{"metadata": {"labels": {"sleeping": "true"}}}``;
        a null value removes a key."""
        return writes.patch(self._store, BY_KIND[kind], namespace, name, patch)

    def delete(self, kind: Kind, namespace: str, name: str, *, graceful: bool = False) -> None:
        """Delete at once (DELETED); `graceful` only sets deletionTimestamp (MODIFIED), as a
        kubelet still stopping the pod, and a later plain delete finishes it. A missing
        object raises `StatusError` 404."""
        self._store.delete(BY_KIND[kind], namespace, name, graceful=graceful)

    def delete_pod(self, namespace: str, name: str, *, graceful: bool = False) -> None:
        """`delete` for a Pod."""
        self.delete("Pod", namespace, name, graceful=graceful)

    def delete_service(self, namespace: str, name: str) -> None:
        """`delete` for a Service."""
        self.delete("Service", namespace, name)

    def delete_endpointslice(self, namespace: str, name: str) -> None:
        """`delete` for an EndpointSlice."""
        self.delete("EndpointSlice", namespace, name)

    def get(self, kind: Kind, namespace: str, name: str) -> JsonObject | None:
        """One object as a GET returns it, or None."""
        resource = BY_KIND[kind]
        obj = self._store.get(resource, namespace, name)
        return None if obj is None else resource.typed(copy.deepcopy(obj))

    def objects(self, kind: Kind, namespace: str | None = None) -> list[JsonObject]:
        """The truth, for assertions: every object of a kind, by namespace and name."""
        resource = BY_KIND[kind]
        return [resource.typed(copy.deepcopy(o)) for o in self._store.select(resource, namespace)]

    def pods(self, namespace: str | None = None) -> list[JsonObject]:
        """`objects` for Pods."""
        return self.objects("Pod", namespace)

    # faults

    async def drop_watches(self, *, reset: bool = False) -> None:
        """End every open watch: a clean end of the chunked stream, or a TCP reset."""
        await self._faults.drop_watches(reset=reset)

    async def refuse(self) -> None:
        """Stop listening (new connections: ECONNREFUSED) and drop every connection."""
        await self._faults.refuse()

    async def blackhole(self) -> None:
        """Accept connections and read requests but never answer; open watches go silent."""
        await self._faults.blackhole()

    def stall(self) -> None:
        """Watch streams, open and new, send nothing at all (not even bookmarks); LISTs answer."""
        self._faults.stall()

    async def restore(self) -> None:
        """Undo refuse, blackhole and stall: listen again on the same port, answer, stream."""
        await self._faults.restore()

    def compact(self) -> None:
        """Forget all history: watching (or an Exact list) from any older version gets 410."""
        self._faults.compact()

    async def stop(self) -> None:
        """End every watch cleanly and close the server (and its admin port)."""
        await self._listener.close(before=self._wind_down)
        if self._admin is not None:
            await self._admin.close(before=_nothing)

    async def _wind_down(self) -> None:
        if self._kubelet is not None:
            self._kubelet.close()
        self._faults.clear()
        await end_watches(self._store.watches, "eof")

    async def _start(self) -> None:
        app = build_app(self._store, self._faults, self._listener, self.config.bookmark_interval)
        await self._listener.start(app)
        if self._admin is not None:
            await self._admin.start(build_admin_app(self._store, self._faults))


def _url(host: str, port: int) -> str:
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _nothing() -> None:
    return None


async def start_apiserver(config: ApiServerSimConfig | None = None) -> ApiServerSim:
    """Start an emulator on the running loop; `stop()` it when done."""
    sim = ApiServerSim(config or ApiServerSimConfig())
    await sim._start()
    return sim


@contextlib.asynccontextmanager
async def running_apiserver(
    config: ApiServerSimConfig | None = None,
) -> AsyncIterator[ApiServerSim]:
    """An emulator for the duration of an ``async with`` block."""
    sim = await start_apiserver(config)
    try:
        yield sim
    finally:
        await sim.stop()
