"""Engines from Kubernetes pods: the pure pod mapping and the source that watches pods.

`pod_to_spec` decides what a pod means for the fleet and nothing else: a pod
is an engine when it has an IP, runs, is Ready and is not being deleted. Its
`kv-events-port` and `kv-events-replay-port` annotations (`kv_event_ports`,
shared with Services) say where its KV events are published; a malformed one
is ignored with a warning, the engine still routable.
`PodSource` keeps the fleet's engines equal to the pods that map to one: every
LIST is a full reconcile (each engine it removes is a deletion the watch
missed, counted and logged), every watch event an upsert or a removal.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Mapping
from typing import Any

from headcount.clock import Clock, Sleep
from headcount.discovery.isolation import Isolation
from headcount.discovery.listwatch import KubeObject, ListerWatcher
from headcount.discovery.reflector import Reflector, ReflectorTiming
from headcount.discovery.source import SourceStatus
from headcount.fleet import EngineSpec, Fleet

__all__ = [
    "KV_EVENTS_PORT_ANNOTATION",
    "KV_EVENTS_REPLAY_PORT_ANNOTATION",
    "PodSource",
    "kv_event_ports",
    "pod_to_spec",
    "reconcile_listed",
]

_log = logging.getLogger(__name__)

KV_EVENTS_PORT_ANNOTATION = "kv-events-port"
KV_EVENTS_REPLAY_PORT_ANNOTATION = "kv-events-replay-port"
_WARNED_MAX = 4096
_warned: dict[tuple[str, str], object] = {}
"""(object, annotation) -> the malformed value last warned about: one warning per value, not
one per watch event or relist."""


def kv_event_ports(annotations: Mapping[str, Any], where: str) -> tuple[int | None, int | None]:
    """The engine's KV-event publisher and replay ports from its annotations, None where
    absent or malformed (the router's `--kv-events-port` / `--kv-events-replay-port` apply)."""
    return (
        _port_annotation(annotations, KV_EVENTS_PORT_ANNOTATION, where),
        _port_annotation(annotations, KV_EVENTS_REPLAY_PORT_ANNOTATION, where),
    )


def _port_annotation(annotations: Mapping[str, Any], key: str, where: str) -> int | None:
    value = annotations.get(key)
    if value is None:
        return None
    text = str(value).strip()
    if text.isdigit() and 1 <= int(text) <= 65535:
        _warned.pop((where, key), None)
        return int(text)
    if _warned.get((where, key)) != value:
        if len(_warned) >= _WARNED_MAX:
            _warned.clear()
        _warned[(where, key)] = value
        _log.warning(
            "%s: annotation %s=%r is not a port (1-65535): ignored, the default applies",
            where,
            key,
            str(value)[:40],
        )
    return None


def pod_to_spec(pod: KubeObject, *, source: str, engine_port: int) -> EngineSpec | None:
    """The engine a pod stands for, or None while it is not one (raises if malformed)."""
    metadata = pod["metadata"]
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if (
        not ip
        or status.get("phase") != "Running"
        or metadata.get("deletionTimestamp")
        or not _is_ready(status)
    ):
        return None
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    object_ref = f"pod/{namespace}/{name}"
    kv_events_port, kv_events_replay_port = kv_event_ports(annotations, object_ref)
    return EngineSpec(
        id=str(metadata["uid"]),
        name=f"{namespace}/{name}",
        url=_engine_url(str(ip), engine_port),
        source=source,
        model_label=labels.get("model"),
        sleeping=labels.get("sleeping") == "true",
        lora_revision=annotations.get("lora-modified"),
        object_ref=object_ref,
        resource_version=str(metadata.get("resourceVersion") or "") or None,
        kv_events_port=kv_events_port,
        kv_events_replay_port=kv_events_replay_port,
    )


def _engine_url(host: str, port: int) -> str:
    """`http://host:port` for an IP (IPv6 in brackets); raises ValueError for a non-IP."""
    try:
        socket.inet_pton(socket.AF_INET, host)
    except OSError:
        return f"http://[{ipaddress.IPv6Address(host)}]:{port}"
    return f"http://{host}:{port}"


def _is_ready(status: Mapping[str, Any]) -> bool:
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list):
        raise TypeError(f"status.conditions is a {type(conditions).__name__}, not a list")
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in conditions
    )


def reconcile_listed(fleet: Fleet, status: SourceStatus, specs: list[EngineSpec]) -> None:
    """Apply a LIST as a full replace; count and log what it removed: deletions the watch missed."""
    before = fleet.snapshot.by_id
    change = fleet.reconcile(status.name, specs)
    if not change.removed:
        return
    status.removed_by_relist += len(change.removed)
    _log.warning(
        "%s: relist removed %d engine(s) the watch had missed: %s",
        status.name,
        len(change.removed),
        ", ".join(sorted(before[engine_id].spec.name for engine_id in change.removed)),
    )


class PodSource:
    """Keeps the fleet's engines of `status.name` equal to the engine pods that exist."""

    def __init__(
        self,
        fleet: Fleet,
        pods: ListerWatcher,
        *,
        engine_port: int,
        label_selector: str,
        timing: ReflectorTiming,
        name: str = "k8s-pods",
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.status = SourceStatus(name=name, kind="k8s-pods")
        self._fleet = fleet
        self._engine_port = engine_port
        self._isolation = Isolation(name)
        self._reflector = Reflector(
            pods,
            status=self.status,
            on_list=self._on_list,
            on_event=self._on_event,
            label_selector=label_selector,
            timing=timing,
            clock=clock,
            sleep=sleep,
        )

    async def run(self) -> None:
        await self._reflector.run()

    def _spec(self, pod: KubeObject) -> EngineSpec | None:
        return self._isolation.apply(self._map, pod)

    def _map(self, pod: KubeObject) -> EngineSpec | None:
        return pod_to_spec(pod, source=self.status.name, engine_port=self._engine_port)

    def _on_list(self, pods: list[KubeObject]) -> None:
        specs = [spec for pod in pods if (spec := self._spec(pod)) is not None]
        reconcile_listed(self._fleet, self.status, specs)

    def _on_event(self, kind: str, pod: KubeObject) -> None:
        uid = str(pod["metadata"]["uid"])
        spec = None if kind == "DELETED" else self._spec(pod)
        if spec is None:
            self._fleet.remove(uid)
        else:
            self._fleet.upsert(spec)
