"""Engines from Kubernetes Services, ready when their EndpointSlices say so.

`service_to_spec` is the pure join of one Service with its EndpointSlices
(discovery.k8s.io/v1, labelled `kubernetes.io/service-name`): the engine is the
Service's cluster DNS name, ready iff any endpoint is ready, spoken to over
https when `--engine-scheme https` says so or its port does (`appProtocol: https`,
or a name `https` or `https-...`, Istio's convention). `ServiceSource`
runs two reflectors, one over the selected Services and one over the
namespace's EndpointSlices, and recomputes a Service whenever either side
changes: a slice whose endpoints turn ready updates the engine though the
Service itself never changed. A selected Service that can never be an engine
(`unroutable_reason`) is kept in its status with the reason, out of the fleet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from headcount.clock import Clock, Sleep
from headcount.config import EngineScheme
from headcount.discovery.isolation import Isolation
from headcount.discovery.joined import Joined, Side
from headcount.discovery.listwatch import KubeObject, ListerWatcher
from headcount.discovery.pods import (
    apply_observed,
    deleted_reason,
    kv_event_ports,
    not_an_engine,
    reconcile_observed,
)
from headcount.discovery.reflector import ReflectorTiming
from headcount.discovery.source import NotAnEngine, SourceStatus, Watched
from headcount.fleet import EngineSpec, Fleet

__all__ = ["SERVICE_NAME_LABEL", "ServiceSource", "service_to_spec", "unroutable_reason"]

_log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""The label that ties an EndpointSlice to its Service."""


def unroutable_reason(service: KubeObject) -> str | None:
    """Why a Service can never be an engine (headless, ExternalName, no port), or None."""
    unroutable = _unroutable(service)
    return None if unroutable is None else unroutable[1]


def _unroutable(service: KubeObject) -> tuple[str, str] | None:
    """(the reason in a word or two, in a sentence), or None for a routable Service."""
    spec = service.get("spec") or {}
    if spec.get("type") == "ExternalName":
        return "external name", "an ExternalName Service has no cluster address"
    if spec.get("clusterIP") == "None":
        return "headless", "a headless Service (clusterIP None) has no single address"
    if not spec.get("ports"):
        return "no port", "the Service has no port"
    return None


def service_to_spec(
    service: KubeObject,
    slices: Iterable[KubeObject],
    *,
    source: str,
    engine_port: int | None = None,
    scheme: EngineScheme = EngineScheme.HTTP,
) -> EngineSpec | None:
    """The engine a Service stands for given its slices, or None (raises if malformed).

    The port is `engine_port` if the Service exposes it, else the port named
    `http` or `https`, else the first one; it is https with `scheme` https, or when the
    port says so (`appProtocol: https`, a name `https` or `https-...`).
    """
    if unroutable_reason(service) is not None:
        return None
    metadata = service["metadata"]
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    port = _engine_port(service["spec"]["ports"], engine_port)
    if _speaks_https(port):
        scheme = EngineScheme.HTTPS
    object_ref = f"service/{namespace}/{name}"
    kv_events_port, kv_events_replay_port = kv_event_ports(annotations, object_ref)
    return EngineSpec(
        id=str(metadata["uid"]),
        name=f"{namespace}/{name}",
        url=f"{scheme.value}://{name}.{namespace}:{port['port']}",
        source=source,
        model_label=labels.get("model"),
        sleeping=labels.get("sleeping") == "true",
        ready=any(_has_ready_endpoint(s) for s in slices),
        lora_revision=annotations.get("lora-modified"),
        object_ref=object_ref,
        resource_version=str(metadata.get("resourceVersion") or "") or None,
        kv_events_port=kv_events_port,
        kv_events_replay_port=kv_events_replay_port,
    )


def _engine_port(ports: Sequence[Mapping[str, Any]], engine_port: int | None) -> Mapping[str, Any]:
    """The Service port engines are reached on, its number checked to be one."""
    numbered = [(int(port["port"]), port) for port in ports]
    for number, port in numbered:
        if number == engine_port:
            return port
    for _, port in numbered:
        if port.get("name") in ("http", "https"):
            return port
    return numbered[0][1]


def _speaks_https(port: Mapping[str, Any]) -> bool:
    name = str(port.get("name") or "")
    protocol = str(port.get("appProtocol") or "").lower()
    return protocol == "https" or name == "https" or name.startswith("https-")


def _has_ready_endpoint(endpoint_slice: KubeObject) -> bool:
    """discovery/v1: a nil `ready` is an unknown state, which consumers treat as ready."""
    for endpoint in endpoint_slice.get("endpoints") or []:
        ready = (endpoint.get("conditions") or {}).get("ready")
        if ready is None or ready is True:
            return True
    return False


class ServiceSource:
    """Keeps the fleet's engines of `status.name` equal to the selected Services."""

    def __init__(
        self,
        fleet: Fleet,
        services: ListerWatcher,
        endpoint_slices: ListerWatcher,
        *,
        engine_port: int | None,
        namespace: str,
        label_selector: str,
        timing: ReflectorTiming,
        scheme: EngineScheme = EngineScheme.HTTP,
        name: str = "k8s-services",
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """`endpoint_slices` lists the namespace's slices; only those with the label are read.

        `namespace`: where both list (for `/health` to say what is watched).
        """
        watched = Watched(
            "services",
            namespace=namespace,
            label_selector=label_selector,
            also=("endpointslices",),
        )
        self.status = SourceStatus(name=name, kind="k8s-services", watches=watched)
        self._fleet = fleet
        self._engine_port = engine_port
        self._scheme = scheme
        self._isolation = Isolation(name)
        self._services: dict[str, KubeObject] = {}
        self._slices: dict[str, KubeObject] = {}
        self._slices_of: dict[str, set[str]] = {}
        self._joined = Joined(
            self.status,
            (
                Side(
                    "services",
                    services,
                    label_selector,
                    self._on_services_list,
                    self._on_service_event,
                ),
                Side(
                    "endpointslices",
                    endpoint_slices,
                    SERVICE_NAME_LABEL,
                    self._on_slices_list,
                    self._on_slice_event,
                ),
            ),
            timing=timing,
            clock=clock,
            sleep=sleep,
        )

    async def run(self) -> None:
        await self._joined.run()

    def _on_services_list(self, services: list[KubeObject]) -> None:
        self._services = {}
        for service in services:
            self._isolation.apply(self._store_service, service)
        self._reconcile()

    def _on_slices_list(self, slices: list[KubeObject]) -> None:
        self._slices = {}
        self._slices_of = {}
        for endpoint_slice in slices:
            self._isolation.apply(self._store_slice, endpoint_slice)
        self._reconcile()

    def _on_service_event(self, kind: str, service: KubeObject) -> None:
        name, uid = str(service["metadata"]["name"]), str(service["metadata"]["uid"])
        previous = self._services.pop(name, None)
        if previous is not None and str(previous["metadata"]["uid"]) != uid:
            previous_uid = str(previous["metadata"]["uid"])
            replaced = "replaced by a new service"
            apply_observed(self._fleet, self.status, previous_uid, None, replaced)
        if kind == "DELETED":
            gone = deleted_reason(service, "service")
            apply_observed(self._fleet, self.status, uid, None, gone)
            return
        self._services[name] = service
        self._refresh(name)

    def _on_slice_event(self, kind: str, endpoint_slice: KubeObject) -> None:
        owners = {self._drop_slice(str(endpoint_slice["metadata"]["name"]))}
        if kind != "DELETED":
            owners.add(self._store_slice(endpoint_slice))
        for owner in owners:
            if owner is not None:
                self._refresh(owner)

    def _store_service(self, service: KubeObject) -> None:
        self._services[str(service["metadata"]["name"])] = service

    def _store_slice(self, endpoint_slice: KubeObject) -> str | None:
        """Remember a slice under its Service; returns that Service's name."""
        metadata = endpoint_slice["metadata"]
        owner = (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if owner is None:
            return None
        name = str(metadata["name"])
        self._slices[name] = endpoint_slice
        self._slices_of.setdefault(str(owner), set()).add(name)
        return str(owner)

    def _drop_slice(self, name: str) -> str | None:
        endpoint_slice = self._slices.pop(name, None)
        if endpoint_slice is None:
            return None
        owner = str(endpoint_slice["metadata"]["labels"][SERVICE_NAME_LABEL])
        names = self._slices_of[owner]
        names.discard(name)
        if not names:
            del self._slices_of[owner]
        return owner

    def _engine(self, service: KubeObject) -> EngineSpec | NotAnEngine:
        unroutable = _unroutable(service)
        if unroutable is not None:
            self._isolation.reject(service, unroutable[1])
            return not_an_engine(service, "service", unroutable[0])
        engine = self._isolation.apply(self._join, service)
        return not_an_engine(service, "service", "malformed") if engine is None else engine

    def _join(self, service: KubeObject) -> EngineSpec | None:
        name = str(service["metadata"]["name"])
        slices = [self._slices[s] for s in sorted(self._slices_of.get(name, ()))]
        return service_to_spec(
            service,
            slices,
            source=self.status.name,
            engine_port=self._engine_port,
            scheme=self._scheme,
        )

    def _reconcile(self) -> None:
        """A LIST on either side: make the fleet equal to the join, count what it removed."""
        if not self._joined.listed:
            return
        engines = [self._engine(service) for service in self._services.values()]
        reconcile_observed(self._fleet, self.status, engines)

    def _refresh(self, service_name: str) -> None:
        """An event on either side: recompute one Service's engine."""
        service = self._services.get(service_name)
        if service is None or not self._joined.listed:
            return
        apply_observed(
            self._fleet, self.status, str(service["metadata"]["uid"]), self._engine(service)
        )
