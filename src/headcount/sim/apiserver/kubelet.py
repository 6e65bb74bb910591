"""A stand-in for the nodes' kubelets, so a pod created with ``kubectl apply`` becomes an engine.

Without one, a created pod stays ``Pending`` with no IP, as in a cluster with
no nodes, and only a hand-written status patch makes it routable. With
``sim-apiserver --kubelet``, every new pod that has no IP yet is started after
a short delay, as a kubelet would once its image is pulled: it gets a node, a
pod IP, phase ``Running`` and ``Ready=True``. The IP is the pod's
``headcount.sim/pod-ip`` annotation if it has one, else the lowest address of
the kubelet's range that no pod holds, so simulated engines listening on
those loopback addresses serve the pods.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Coroutine
from typing import Any

from headcount.clock import Sleep
from headcount.sim.apiserver import writes
from headcount.sim.apiserver.events import Event
from headcount.sim.apiserver.objects import JsonObject, dicts, field, timestamp
from headcount.sim.apiserver.resources import PODS
from headcount.sim.apiserver.status import StatusError
from headcount.sim.apiserver.store import Store

__all__ = ["POD_IP_ANNOTATION", "Kubelet", "address_range"]

_log = logging.getLogger(__name__)

POD_IP_ANNOTATION = "headcount.sim/pod-ip"
"""A pod's chosen IP, for a simulated engine already listening there."""
_NODE = "sim-node"


def address_range(text: str) -> tuple[str, ...]:
    """``FIRST-LAST`` (inclusive, IPv4) as its addresses; raises ValueError if malformed."""
    first_text, dash, last_text = text.partition("-")
    first = ipaddress.IPv4Address(first_text.strip())
    last = ipaddress.IPv4Address(last_text.strip()) if dash else first
    if last < first:
        raise ValueError(f"{text!r}: the last address is below the first")
    if int(last) - int(first) >= 65536:
        raise ValueError(f"{text!r}: more than 65536 addresses")
    return tuple(str(ipaddress.IPv4Address(n)) for n in range(int(first), int(last) + 1))


class Kubelet:
    """Starts the store's new pods after `delay` seconds (see the module docstring)."""

    def __init__(
        self, store: Store, addresses: tuple[str, ...], delay: float, sleep: Sleep
    ) -> None:
        self._store = store
        self._addresses = addresses
        self._delay = delay
        self._sleep = sleep
        self._tasks: set[asyncio.Task[None]] = set()

    def observe(self, event: Event) -> None:
        """Called for every change to the store: a pod created without an IP gets started."""
        if event.resource is PODS and event.type == "ADDED" and _unstarted(event.obj):
            self._spawn(self._start(event.obj["metadata"]["namespace"], event.obj))

    def close(self) -> None:
        """Start nothing more: the server is stopping."""
        for task in self._tasks:
            task.cancel()

    async def _start(self, namespace: str, created: JsonObject) -> None:
        name, uid = created["metadata"]["name"], created["metadata"].get("uid")
        await self._sleep(self._delay)
        pod = self._store.get(PODS, namespace, name)
        if pod is None or pod["metadata"].get("uid") != uid or not _unstarted(pod):
            return  # deleted, replaced, or started by someone else meanwhile
        ip = self._address_for(pod)
        if ip is None:
            _log.warning(
                "sim kubelet: pod %s/%s stays Pending: no free address in its range and no "
                "valid %s annotation",
                namespace,
                name,
                POD_IP_ANNOTATION,
            )
            return
        try:
            writes.patch(self._store, PODS, namespace, name, _running(pod, ip))
        except StatusError as error:
            _log.warning("sim kubelet: pod %s/%s not started: %s", namespace, name, error)
            return
        _log.info("sim kubelet: pod %s/%s is running and ready at %s", namespace, name, ip)

    def _address_for(self, pod: JsonObject) -> str | None:
        chosen = field(pod, "metadata", "annotations", POD_IP_ANNOTATION)
        if isinstance(chosen, str) and chosen:
            try:
                return str(ipaddress.ip_address(chosen))
            except ValueError:
                return None
        taken = {field(p, "status", "podIP") for p in self._store.select(PODS, None)}
        return next((ip for ip in self._addresses if ip not in taken), None)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _unstarted(pod: JsonObject) -> bool:
    return not field(pod, "status", "podIP") and not field(pod, "metadata", "deletionTimestamp")


def _running(pod: JsonObject, ip: str) -> JsonObject:
    """The merge patch a kubelet's status updates add up to for a pod that started well."""
    now = timestamp()
    containers = [c for c in dicts(field(pod, "spec", "containers")) if "name" in c]
    return {
        "spec": {"nodeName": field(pod, "spec", "nodeName") or _NODE},
        "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "conditions": [
                {"type": kind, "status": "True", "lastTransitionTime": now}
                for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": now}},
                }
                for container in containers
            ],
        },
    }
