"""The columns kubectl shows for each resource, computed here because kubectl asks for a Table.

`kubectl get` prints what the server's Table rows say, so these mirror the
real server's printers: the same column names, descriptions and priorities,
and cells derived from the object as a cluster reports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from headcount.sim.apiserver.objects import JsonObject, as_list, dicts, field

__all__ = [
    "CUSTOM_RESOURCE_COLUMNS",
    "ENDPOINTSLICE_COLUMNS",
    "POD_COLUMNS",
    "SERVICE_COLUMNS",
    "custom_resource_cells",
    "endpointslice_cells",
    "pod_cells",
    "service_cells",
]


def _column(name: str, description: str, *, priority: int = 0, fmt: str = "") -> JsonObject:
    return {
        "name": name,
        "type": "string",
        "format": fmt,
        "description": description,
        "priority": priority,
    }


_NAME_COLUMN = _column("Name", "Name must be unique within a namespace.", fmt="name")
_AGE_COLUMN = _column("Age", "CreationTimestamp is a timestamp of when the object was created.")

POD_COLUMNS = (
    _NAME_COLUMN,
    _column("Ready", "The aggregate readiness state of this pod for accepting traffic."),
    _column("Status", "The aggregate status of the containers in this pod."),
    _column("Restarts", "The number of times the containers in this pod have been restarted."),
    _AGE_COLUMN,
    _column("IP", "IP address allocated to the pod.", priority=1),
    _column("Node", "NodeName is the node this pod runs on.", priority=1),
    _column("Nominated Node", "The node this pod is nominated to run on.", priority=1),
    _column("Readiness Gates", "Readiness gates of this pod.", priority=1),
)
SERVICE_COLUMNS = (
    _NAME_COLUMN,
    _column("Type", "The way the service is exposed."),
    _column("Cluster-IP", "The IP address of the service, assigned by the master."),
    _column("External-IP", "External IP addresses for which nodes accept traffic."),
    _column("Port(s)", "The ports exposed by this service."),
    _AGE_COLUMN,
    _column("Selector", "Route traffic to pods with labels matching this selector.", priority=1),
)
ENDPOINTSLICE_COLUMNS = (
    _NAME_COLUMN,
    _column("AddressType", "The type of address carried by this EndpointSlice."),
    _column("Ports", "The ports exposed by this EndpointSlice."),
    _column("Endpoints", "The addresses of the endpoints in this EndpointSlice."),
    _AGE_COLUMN,
)

CUSTOM_RESOURCE_COLUMNS = (_NAME_COLUMN, _AGE_COLUMN)
"""What the server prints of a custom resource whose CRD declares no printer columns."""


def _human_age(created: Any) -> str:
    """`kubectl`'s age: "45s", "3m12s", "2h5m", "3d"."""
    if not isinstance(created, str):
        return "<unknown>"
    try:
        then = datetime.fromisoformat(created)
    except ValueError:
        return "<unknown>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = int((datetime.now(UTC) - then).total_seconds())
    minutes, hours = seconds // 60, seconds // 3600
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def pod_cells(pod: JsonObject) -> list[Any]:
    statuses = dicts(field(pod, "status", "containerStatuses"))
    containers = dicts(field(pod, "spec", "containers"))
    ready = sum(1 for status in statuses if status.get("ready") is True)
    restarts = sum(s["restartCount"] for s in statuses if isinstance(s.get("restartCount"), int))
    if field(pod, "metadata", "deletionTimestamp"):
        state = "Terminating"
    else:
        state = field(pod, "status", "reason") or field(pod, "status", "phase") or "Unknown"
    return [
        field(pod, "metadata", "name"),
        f"{ready}/{len(containers)}",
        str(state),
        str(restarts),
        _human_age(field(pod, "metadata", "creationTimestamp")),
        field(pod, "status", "podIP") or "<none>",
        field(pod, "spec", "nodeName") or "<none>",
        field(pod, "status", "nominatedNodeName") or "<none>",
        "<none>",
    ]


def service_cells(service: JsonObject) -> list[Any]:
    ports = [
        f"{port.get('port')}/{port.get('protocol', 'TCP')}"
        for port in dicts(field(service, "spec", "ports"))
    ]
    selector = field(service, "spec", "selector")
    selector_text = (
        ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        if isinstance(selector, Mapping) and selector
        else "<none>"
    )
    return [
        field(service, "metadata", "name"),
        field(service, "spec", "type") or "ClusterIP",
        field(service, "spec", "clusterIP") or "<none>",
        "<none>",
        ",".join(ports) or "<none>",
        _human_age(field(service, "metadata", "creationTimestamp")),
        selector_text,
    ]


def endpointslice_cells(endpoint_slice: JsonObject) -> list[Any]:
    ports = [str(port.get("port")) for port in dicts(endpoint_slice.get("ports"))]
    addresses = [
        str(address)
        for endpoint in dicts(endpoint_slice.get("endpoints"))
        for address in as_list(endpoint.get("addresses"))
    ]
    shown = ",".join(addresses[:3]) + (
        f" + {len(addresses) - 3} more..." if len(addresses) > 3 else ""
    )
    return [
        field(endpoint_slice, "metadata", "name"),
        endpoint_slice.get("addressType") or "<unset>",
        ",".join(ports) or "<unset>",
        shown or "<unset>",
        _human_age(field(endpoint_slice, "metadata", "creationTimestamp")),
    ]


def custom_resource_cells(obj: JsonObject) -> list[Any]:
    return [
        field(obj, "metadata", "name"),
        _human_age(field(obj, "metadata", "creationTimestamp")),
    ]
