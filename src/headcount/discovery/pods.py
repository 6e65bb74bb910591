"""Engines from Kubernetes pods: the pure pod mapping and the source that watches pods.

`pod_to_spec` decides what a pod means for the fleet and nothing else: a pod
is an engine when it has an IP, runs, is Ready and is not being deleted;
`why_not_an_engine` names what it lacks otherwise (`pod_engine` answers both); the
engine is `http://` or `https://` its IP as `--engine-scheme` says. Its
`kv-events-port` and `kv-events-replay-port` annotations (`kv_event_ports`,
shared with Services) say where its KV events are published; a malformed one
is ignored with a warning, the engine still routable.
`PodSource` keeps the fleet's engines equal to the pods that map to one: every
LIST is a full reconcile (each engine it removes is a deletion the watch
missed, counted and logged), every watch event an upsert or a removal, with
its reason for the log. The pods it matched that are not engines are kept in
its status with the reason.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from headcount.clock import Clock, Sleep
from headcount.config import EngineScheme
from headcount.discovery.isolation import Isolation
from headcount.discovery.listwatch import KubeObject, ListerWatcher, object_key
from headcount.discovery.reflector import Reflector, ReflectorTiming
from headcount.discovery.source import NotAnEngine, SourceStatus, Watched
from headcount.fleet import EngineSpec, Fleet

__all__ = [
    "KV_EVENTS_PORT_ANNOTATION",
    "KV_EVENTS_REPLAY_PORT_ANNOTATION",
    "PodSource",
    "apply_engines",
    "apply_observed",
    "deleted_reason",
    "kv_event_ports",
    "not_an_engine",
    "pod_engine",
    "pod_to_spec",
    "reconcile_listed",
    "reconcile_observed",
    "why_not_an_engine",
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


_PHASES = {None: "pending", "Pending": "pending", "Succeeded": "succeeded", "Failed": "failed"}
"""A pod's phase other than Running, in the words `/health` counts it by."""


def why_not_an_engine(pod: KubeObject) -> str | None:
    """Why a pod is not an engine now (`terminating`, `pending`, `no IP`, `not ready`...),
    or None when it is one (raises if malformed)."""
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return "terminating"
    phase = status.get("phase")
    if phase != "Running":
        return _PHASES.get(phase, "not running")
    if not status.get("podIP"):
        return "no IP"
    if not _is_ready(status):
        return "not ready"
    return None


def pod_to_spec(
    pod: KubeObject, *, source: str, engine_port: int, scheme: EngineScheme = EngineScheme.HTTP
) -> EngineSpec | None:
    """The engine a pod stands for, or None while it is not one (raises if malformed)."""
    engine = pod_engine(pod, source=source, engine_port=engine_port, scheme=scheme)
    return engine if isinstance(engine, EngineSpec) else None


def pod_engine(
    pod: KubeObject, *, source: str, engine_port: int, scheme: EngineScheme = EngineScheme.HTTP
) -> EngineSpec | str:
    """The engine a pod stands for, or why it is not one (raises if malformed)."""
    reason = why_not_an_engine(pod)
    if reason is not None:
        return reason
    metadata = pod["metadata"]
    ip = pod["status"]["podIP"]
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    object_ref = f"pod/{namespace}/{name}"
    kv_events_port, kv_events_replay_port = kv_event_ports(annotations, object_ref)
    return EngineSpec(
        id=str(metadata["uid"]),
        name=f"{namespace}/{name}",
        url=_engine_url(scheme, str(ip), engine_port),
        source=source,
        model_label=labels.get("model"),
        sleeping=labels.get("sleeping") == "true",
        lora_revision=annotations.get("lora-modified"),
        object_ref=object_ref,
        resource_version=str(metadata.get("resourceVersion") or "") or None,
        kv_events_port=kv_events_port,
        kv_events_replay_port=kv_events_replay_port,
    )


def _engine_url(scheme: EngineScheme, host: str, port: int) -> str:
    """`scheme://host:port` for an IP (IPv6 in brackets); raises ValueError for a non-IP."""
    try:
        socket.inet_pton(socket.AF_INET, host)
    except OSError:
        return f"{scheme.value}://[{ipaddress.IPv6Address(host)}]:{port}"
    return f"{scheme.value}://{host}:{port}"


def _is_ready(status: Mapping[str, Any]) -> bool:
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list):
        raise TypeError(f"status.conditions is a {type(conditions).__name__}, not a list")
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in conditions
    )


def not_an_engine(obj: KubeObject, kind: str, reason: str) -> NotAnEngine:
    """The record of a matched `kind` object (`pod`, `service`) that is not an engine."""
    uid, _ = object_key(obj)
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    fields = metadata if isinstance(metadata, Mapping) else {}
    name = f"{fields.get('namespace', '?')}/{fields.get('name', '?')}"
    return NotAnEngine(id=uid, name=name, object_ref=f"{kind}/{name}", reason=reason)


def reconcile_listed(
    fleet: Fleet, status: SourceStatus, specs: list[EngineSpec], cause: str | None = None
) -> None:
    """Apply a LIST as a full replace; count what it removed: deletions the watch missed (the
    fleet logs each). With `cause` (what selects the objects changed) the removals are logged
    with it instead, and not counted."""
    if cause is not None:
        fleet.reconcile(status.name, specs, removed_reason=cause)
        return
    change = fleet.reconcile(
        status.name,
        specs,
        removed_reason="relist removed: the watch missed its deletion",
        removal_is_failure=True,
    )
    status.removed_by_relist += len(change.removed)


def reconcile_observed(
    fleet: Fleet,
    status: SourceStatus,
    observed: list[EngineSpec | NotAnEngine],
    cause: str | None = None,
) -> None:
    """Apply a LIST of mapped objects: the engines to the fleet, the rest to the status."""
    specs = [engine for engine in observed if isinstance(engine, EngineSpec)]
    reconcile_listed(fleet, status, specs, cause)
    status.not_engines = {
        engine.id: engine for engine in observed if isinstance(engine, NotAnEngine)
    }


_FAILURES = frozenset({"not ready", "failed", "not running", "malformed"})
"""Reasons an object stops being an engine that are faults (its removal is a warning)."""


def apply_observed(
    fleet: Fleet,
    status: SourceStatus,
    uid: str,
    observed: EngineSpec | NotAnEngine | None,
    gone: str = "deleted",
) -> None:
    """Apply one changed object: an engine, a non-engine, or gone (None; `gone` says why)."""
    engines = [observed] if isinstance(observed, EngineSpec) else observed
    apply_engines(fleet, status, uid, engines, (uid,), gone)


def apply_engines(
    fleet: Fleet,
    status: SourceStatus,
    uid: str,
    observed: Sequence[EngineSpec] | NotAnEngine | None,
    engine_ids: Iterable[str],
    gone: str = "deleted",
) -> None:
    """Apply one changed object `uid` that stands for several engines (`engine_ids`, those it
    may have): its engines, a non-engine, or gone (None; `gone` says why)."""
    if observed is None or isinstance(observed, NotAnEngine):
        status.note(uid, observed)
        reason = gone if observed is None else observed.reason
        for engine_id in engine_ids:
            fleet.remove(engine_id, reason, failure=reason in _FAILURES and observed is not None)
        return
    status.note(uid, None)
    for engine in observed:
        fleet.upsert(engine)


def deleted_reason(obj: KubeObject, what: str) -> str:
    """Why the engine of `obj` (a `what`: pod, service) leaves on a DELETED event.

    One that was not being deleted has left the label selector, or was deleted at once: the
    event cannot say which (the API server sends the object as it last matched).
    """
    if obj["metadata"].get("deletionTimestamp"):
        return f"{what} deleted"
    return f"{what} deleted or no longer selected"


class PodSource:
    """Keeps the fleet's engines of `status.name` equal to the engine pods that exist."""

    def __init__(
        self,
        fleet: Fleet,
        pods: ListerWatcher,
        *,
        engine_port: int,
        namespace: str,
        label_selector: str,
        timing: ReflectorTiming,
        scheme: EngineScheme = EngineScheme.HTTP,
        name: str = "k8s-pods",
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """`namespace`: where `pods` lists (for `/health` to say what is watched)."""
        self.status = SourceStatus(
            name=name,
            kind="k8s-pods",
            watches=Watched("pods", namespace=namespace, label_selector=label_selector),
        )
        self._fleet = fleet
        self._engine_port = engine_port
        self._scheme = scheme
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

    def _engine(self, pod: KubeObject) -> EngineSpec | NotAnEngine:
        engine = self._isolation.apply(self._map, pod)
        if isinstance(engine, EngineSpec):
            return engine
        return not_an_engine(pod, "pod", "malformed" if engine is None else engine)

    def _map(self, pod: KubeObject) -> EngineSpec | str:
        return pod_engine(
            pod, source=self.status.name, engine_port=self._engine_port, scheme=self._scheme
        )

    def _on_list(self, pods: list[KubeObject]) -> None:
        reconcile_observed(self._fleet, self.status, [self._engine(pod) for pod in pods])

    def _on_event(self, kind: str, pod: KubeObject) -> None:
        uid = str(pod["metadata"]["uid"])
        engine = None if kind == "DELETED" else self._engine(pod)
        apply_observed(self._fleet, self.status, uid, engine, deleted_reason(pod, "pod"))
