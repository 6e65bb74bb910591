"""The resource types the emulator serves: their names, API group, field labels and columns.

Three kinds, as a cluster running vLLM pods behind Services has them: core/v1
Pods and Services, discovery.k8s.io/v1 EndpointSlices; and one custom resource,
as a cluster with the Gateway API Inference Extension's CRD installed has it:
inference.networking.k8s.io/v1 InferencePools.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from headcount.sim.apiserver.columns import (
    CUSTOM_RESOURCE_COLUMNS,
    ENDPOINTSLICE_COLUMNS,
    POD_COLUMNS,
    SERVICE_COLUMNS,
    custom_resource_cells,
    endpointslice_cells,
    pod_cells,
    service_cells,
)
from headcount.sim.apiserver.objects import JsonObject

__all__ = [
    "BY_KIND",
    "BY_PATH",
    "BY_PLURAL",
    "ENDPOINTSLICES",
    "GROUPS",
    "INFERENCEPOOLS",
    "PODS",
    "RESOURCES",
    "SERVICES",
    "Kind",
    "Resource",
]

Kind = Literal["Pod", "Service", "EndpointSlice", "InferencePool"]


@dataclass(frozen=True, eq=False)
class Resource:
    """One served resource type: its names, its API group and how kubectl tabulates it."""

    kind: Kind
    plural: str
    singular: str
    group: str
    version: str
    short_names: tuple[str, ...]
    field_labels: frozenset[str]
    columns: tuple[JsonObject, ...]
    cells: Callable[[JsonObject], list[Any]]
    custom: bool = False
    """Served from a CustomResourceDefinition, as the real server serves one."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def typed(self, obj: JsonObject) -> JsonObject:
        """The object as a GET or a watch event carries it: with kind and apiVersion."""
        return {"kind": self.kind, "apiVersion": self.api_version, **obj}

    def discovery_entry(self) -> JsonObject:
        entry: JsonObject = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": True,
            "kind": self.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if not self.group:
            entry["categories"] = ["all"]
        return entry


_METADATA_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
PODS = Resource(
    kind="Pod",
    plural="pods",
    singular="pod",
    group="",
    version="v1",
    short_names=("po",),
    field_labels=_METADATA_FIELDS
    | {"spec.nodeName", "spec.restartPolicy", "status.phase", "status.podIP"},
    columns=POD_COLUMNS,
    cells=pod_cells,
)
SERVICES = Resource(
    kind="Service",
    plural="services",
    singular="service",
    group="",
    version="v1",
    short_names=("svc",),
    field_labels=_METADATA_FIELDS,
    columns=SERVICE_COLUMNS,
    cells=service_cells,
)
ENDPOINTSLICES = Resource(
    kind="EndpointSlice",
    plural="endpointslices",
    singular="endpointslice",
    group="discovery.k8s.io",
    version="v1",
    short_names=(),
    field_labels=_METADATA_FIELDS,
    columns=ENDPOINTSLICE_COLUMNS,
    cells=endpointslice_cells,
)
INFERENCEPOOLS = Resource(
    kind="InferencePool",
    plural="inferencepools",
    singular="inferencepool",
    group="inference.networking.k8s.io",
    version="v1",
    short_names=("infpool",),
    field_labels=_METADATA_FIELDS,
    columns=CUSTOM_RESOURCE_COLUMNS,
    cells=custom_resource_cells,
    custom=True,
)
RESOURCES = (PODS, SERVICES, ENDPOINTSLICES, INFERENCEPOOLS)
BY_KIND: dict[str, Resource] = {resource.kind: resource for resource in RESOURCES}
BY_PLURAL = {resource.plural: resource for resource in RESOURCES}
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
GROUPS = sorted({r.group for r in RESOURCES if r.group})
