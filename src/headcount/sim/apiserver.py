"""An in-memory Kubernetes API server on loopback, so discovery is tested against the real protocol.

Kubernetes cannot run where headcount is built, so this emulator speaks the
kube-apiserver's HTTP API closely enough for the official clients and kubectl,
for three resources: core/v1 Pods and Services, discovery.k8s.io/v1
EndpointSlices. It serves LIST with label and field selectors, chunked WATCH
from a resourceVersion (history replay, selector transitions, bookmarks,
``timeoutSeconds``), a bounded history whose older versions answer ``410
Expired``, discovery documents, Table output for kubectl, and every error as a
``Status`` object. On top come the faults a client must survive::

    async with running_apiserver(ApiServerSimConfig(bookmark_interval=0.5)) as sim:
        sim.kubeconfig(tmp_path / "kubeconfig")
        sim.apply_pod(make_pod("engine-0", labels={"app": "vllm"}, ip="127.0.0.2"))
        await sim.drop_watches(reset=True)  # every open watch ends with a TCP reset
        sim.compact()  # any older resourceVersion now answers 410
        await sim.refuse()  # ECONNREFUSED ...
        await sim.restore()  # ... then the same port serves again

The same controls exist over HTTP on the server itself (JSON bodies)::

    GET    /_sim/state
    POST   /_sim/faults/{drop-watches|refuse|blackhole|stall|compact|restore}
           drop-watches: {"reset": bool}; refuse: {"seconds": N}, required, since
           a refusing server cannot be told to restore
    PUT    /_sim/objects                           create or replace (kind from the body)
    PATCH  /_sim/objects/{plural}/{namespace}/{name}  JSON merge patch
    DELETE /_sim/objects/{plural}/{namespace}/{name}[?graceful=true]

The real API's create (POST), replace (PUT), merge patch (PATCH) and delete
(DELETE) work too; a REST DELETE removes a pod at once, as for a pod no kubelet
runs. Not modelled: namespaces as objects, authentication, pagination
(``limit`` is ignored, as when the real server lists from its cache),
protobuf, server-side apply, the OpenAPI document (so ``kubectl create`` and
``apply`` need ``--validate=false``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import re
import signal
import socket
import struct
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from aiohttp.typedefs import Handler

__all__ = [
    "ApiServerSim",
    "ApiServerSimConfig",
    "Kind",
    "StatusError",
    "add_arguments",
    "config_from_args",
    "main",
    "make_endpointslice",
    "make_pod",
    "make_service",
    "running_apiserver",
    "serve_forever",
    "start_apiserver",
]

_log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Kind = Literal["Pod", "Service", "EndpointSlice"]
_EventType = Literal["ADDED", "MODIFIED", "DELETED"]
_Ending = Literal["eof", "abort"]

_GIT_VERSION = "v1.30.0"
_FIRST_RESOURCE_VERSION = 1
_GRACE_PERIOD_SECONDS = 30
_FINISH_TIMEOUT = 5.0
"""How long a fault waits for the watches it ends to be gone (a client that reads nothing)."""

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_NUMBER = re.compile(r"[0-9]{1,19}")
"""A resourceVersion or timeoutSeconds: an unsigned 64-bit integer, as the real server parses it."""
_INTEGER = re.compile(r"-?[0-9]{1,19}")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SELECTOR_TOKEN = re.compile(r"==|!=|=|!|,|\(|\)|<|>|[^\s!=,()<>]+")
_SELECTOR_SYMBOLS = frozenset({"==", "!=", "=", "!", ",", "(", ")", "<", ">"})
_UNESCAPED_COMMA = re.compile(r"(?<!\\),")


# --- errors ----------------------------------------------------------------------------------


class StatusError(Exception):
    """A request the real API server would refuse, carrying the ``Status`` it would answer.

    Raised by the Python API too: ``sim.delete_pod("default", "gone")`` raises
    ``StatusError`` with ``code == 404`` and ``reason == "NotFound"``.
    """

    def __init__(
        self, code: int, reason: str, message: str, details: JsonObject | None = None
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def to_status(self) -> JsonObject:
        """The ``Status`` object, as the server puts it in a body or an ERROR event."""
        status: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            status["details"] = self.details
        status["code"] = self.code
        return status


def _bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def _invalid(resource: _Resource, name: str, message: str) -> StatusError:
    details = {"name": name, "group": resource.group, "kind": resource.kind}
    return StatusError(422, "Invalid", f'{resource.kind} "{name}" is invalid: {message}', details)


def _not_found(resource: _Resource, name: str) -> StatusError:
    details = {"name": name, "group": resource.group, "kind": resource.plural}
    return StatusError(404, "NotFound", f'{resource.plural} "{name}" not found', details)


def _too_old(requested: int, oldest: int) -> StatusError:
    return StatusError(410, "Expired", f"too old resource version: {requested} ({oldest})")


_NO_SUCH_RESOURCE = StatusError(404, "NotFound", "the server could not find the requested resource")


# --- resources and their Table columns ---------------------------------------------------------


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

_POD_COLUMNS = (
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
_SERVICE_COLUMNS = (
    _NAME_COLUMN,
    _column("Type", "The way the service is exposed."),
    _column("Cluster-IP", "The IP address of the service, assigned by the master."),
    _column("External-IP", "External IP addresses for which nodes accept traffic."),
    _column("Port(s)", "The ports exposed by this service."),
    _AGE_COLUMN,
    _column("Selector", "Route traffic to pods with labels matching this selector.", priority=1),
)
_ENDPOINTSLICE_COLUMNS = (
    _NAME_COLUMN,
    _column("AddressType", "The type of address carried by this EndpointSlice."),
    _column("Ports", "The ports exposed by this EndpointSlice."),
    _column("Endpoints", "The addresses of the endpoints in this EndpointSlice."),
    _AGE_COLUMN,
)


def _field(obj: Mapping[str, Any], *path: str) -> Any:
    """The value at a dotted path, or None wherever the object is missing or malformed."""
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    """The mappings in a list field, ignoring a malformed field or malformed items."""
    return [item for item in _list(value) if isinstance(item, Mapping)]


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


def _pod_cells(pod: JsonObject) -> list[Any]:
    statuses = _dicts(_field(pod, "status", "containerStatuses"))
    containers = _dicts(_field(pod, "spec", "containers"))
    ready = sum(1 for status in statuses if status.get("ready") is True)
    restarts = sum(s["restartCount"] for s in statuses if isinstance(s.get("restartCount"), int))
    if _field(pod, "metadata", "deletionTimestamp"):
        state = "Terminating"
    else:
        state = _field(pod, "status", "reason") or _field(pod, "status", "phase") or "Unknown"
    return [
        _field(pod, "metadata", "name"),
        f"{ready}/{len(containers)}",
        str(state),
        str(restarts),
        _human_age(_field(pod, "metadata", "creationTimestamp")),
        _field(pod, "status", "podIP") or "<none>",
        _field(pod, "spec", "nodeName") or "<none>",
        _field(pod, "status", "nominatedNodeName") or "<none>",
        "<none>",
    ]


def _service_cells(service: JsonObject) -> list[Any]:
    ports = [
        f"{port.get('port')}/{port.get('protocol', 'TCP')}"
        for port in _dicts(_field(service, "spec", "ports"))
    ]
    selector = _field(service, "spec", "selector")
    selector_text = (
        ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        if isinstance(selector, Mapping) and selector
        else "<none>"
    )
    return [
        _field(service, "metadata", "name"),
        _field(service, "spec", "type") or "ClusterIP",
        _field(service, "spec", "clusterIP") or "<none>",
        "<none>",
        ",".join(ports) or "<none>",
        _human_age(_field(service, "metadata", "creationTimestamp")),
        selector_text,
    ]


def _endpointslice_cells(endpoint_slice: JsonObject) -> list[Any]:
    ports = [str(port.get("port")) for port in _dicts(endpoint_slice.get("ports"))]
    addresses = [
        str(address)
        for endpoint in _dicts(endpoint_slice.get("endpoints"))
        for address in _list(endpoint.get("addresses"))
    ]
    shown = ",".join(addresses[:3]) + (
        f" + {len(addresses) - 3} more..." if len(addresses) > 3 else ""
    )
    return [
        _field(endpoint_slice, "metadata", "name"),
        endpoint_slice.get("addressType") or "<unset>",
        ",".join(ports) or "<unset>",
        shown or "<unset>",
        _human_age(_field(endpoint_slice, "metadata", "creationTimestamp")),
    ]


@dataclass(frozen=True, eq=False)
class _Resource:
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
_PODS = _Resource(
    kind="Pod",
    plural="pods",
    singular="pod",
    group="",
    version="v1",
    short_names=("po",),
    field_labels=_METADATA_FIELDS
    | {"spec.nodeName", "spec.restartPolicy", "status.phase", "status.podIP"},
    columns=_POD_COLUMNS,
    cells=_pod_cells,
)
_SERVICES = _Resource(
    kind="Service",
    plural="services",
    singular="service",
    group="",
    version="v1",
    short_names=("svc",),
    field_labels=_METADATA_FIELDS,
    columns=_SERVICE_COLUMNS,
    cells=_service_cells,
)
_ENDPOINTSLICES = _Resource(
    kind="EndpointSlice",
    plural="endpointslices",
    singular="endpointslice",
    group="discovery.k8s.io",
    version="v1",
    short_names=(),
    field_labels=_METADATA_FIELDS,
    columns=_ENDPOINTSLICE_COLUMNS,
    cells=_endpointslice_cells,
)
_RESOURCES = (_PODS, _SERVICES, _ENDPOINTSLICES)
_BY_KIND: dict[str, _Resource] = {resource.kind: resource for resource in _RESOURCES}
_BY_PLURAL = {resource.plural: resource for resource in _RESOURCES}
_BY_PATH = {(r.group, r.version, r.plural): r for r in _RESOURCES}
_GROUPS = sorted({r.group for r in _RESOURCES if r.group})


# --- selectors -------------------------------------------------------------------------------


def _valid_label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def _valid_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _QUALIFIED_NAME.fullmatch(value) is not None)


@dataclass(frozen=True)
class _Requirement:
    """One term of a label selector: ``key op values``."""

    key: str
    operator: Literal["=", "!=", "in", "notin", "exists", "!", ">", "<"]
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "exists":
                return value is not None
            case "!":
                return value is None
            case "=" | "in":
                return value in self.values
            case "!=" | "notin":
                return value not in self.values
        if value is None or not _INTEGER.fullmatch(value):
            return False
        bound = int(next(iter(self.values)))
        return int(value) > bound if self.operator == ">" else int(value) < bound


class _SelectorParser:
    """The label selector grammar of ``k8s.io/apimachinery/pkg/labels``."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._tokens = _SELECTOR_TOKEN.findall(text)
        self._at = 0

    def parse(self) -> tuple[_Requirement, ...]:
        if not self._tokens:
            return ()
        requirements = [self._requirement()]
        while self._peek() == ",":
            self._at += 1
            requirements.append(self._requirement())
        if self._peek() is not None:
            raise self._error(f"found '{self._peek()}', expected: ',' or 'end of string'")
        return tuple(requirements)

    def _peek(self) -> str | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _take(self) -> str | None:
        token = self._peek()
        self._at += 1
        return token

    def _error(self, message: str) -> StatusError:
        return _bad_request(f"unable to parse requirement: {message} in {self._text!r}")

    def _key(self) -> str:
        key = self._take()
        if key is None or key in _SELECTOR_SYMBOLS or not _valid_label_key(key):
            raise self._error(f"invalid label key {key!r}")
        return key

    def _value(self) -> str:
        if self._peek() in _SELECTOR_SYMBOLS or self._peek() is None:
            return ""  # `a=` and `in (a,)` name the empty value
        value = self._take() or ""
        if not _valid_label_value(value):
            raise self._error(f"invalid label value {value!r}")
        return value

    def _requirement(self) -> _Requirement:
        if self._peek() == "!":
            self._at += 1
            return _Requirement(self._key(), "!")
        key = self._key()
        operator = self._peek()
        if operator is None or operator == ",":
            return _Requirement(key, "exists")
        self._at += 1
        if operator in ("=", "==", "!="):
            return _Requirement(key, "!=" if operator == "!=" else "=", frozenset({self._value()}))
        if operator in ("in", "notin"):
            return _Requirement(key, "in" if operator == "in" else "notin", self._value_set())
        if operator in (">", "<"):
            bound = self._take()
            if bound is None or not _INTEGER.fullmatch(bound):
                raise self._error(f"for '{operator}', the value must be an integer")
            return _Requirement(key, ">" if operator == ">" else "<", frozenset({bound}))
        raise self._error(f"found '{operator}', expected an operator")

    def _value_set(self) -> frozenset[str]:
        if self._take() != "(":
            raise self._error("expected '(' after 'in' or 'notin'")
        if self._peek() == ")":
            raise self._error("for 'in', 'notin' operators, values set can't be empty")
        values = {self._value()}
        while self._peek() == ",":
            self._at += 1
            values.add(self._value())
        if self._take() != ")":
            raise self._error("expected ')' to close the value set")
        return frozenset(values)


def _parse_label_selector(text: str) -> tuple[_Requirement, ...]:
    return _SelectorParser(text).parse()


@dataclass(frozen=True)
class _FieldRequirement:
    path: tuple[str, ...]
    value: str
    equal: bool

    def matches(self, obj: JsonObject) -> bool:
        actual = _field(obj, *self.path)
        return (("" if actual is None else str(actual)) == self.value) == self.equal


def _parse_field_selector(text: str, resource: _Resource) -> tuple[_FieldRequirement, ...]:
    requirements = []
    for term in _UNESCAPED_COMMA.split(text) if text else ():
        match = re.match(r"(.*?)(!=|==|=)(.*)", term, re.DOTALL)
        if match is None:
            raise _bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        key, operator, value = match.groups()
        if key not in resource.field_labels:
            raise _bad_request(f'field label not supported: "{key}"')
        value = value.replace("\\,", ",").replace("\\=", "=").replace("\\\\", "\\")
        requirements.append(_FieldRequirement(tuple(key.split(".")), value, operator != "!="))
    return tuple(requirements)


# --- objects ---------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _labels(obj: JsonObject) -> Mapping[str, str]:
    labels = _field(obj, "metadata", "labels")
    return labels if isinstance(labels, Mapping) else {}


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: mappings merge, a null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge_patch(merged.get(key), value)
    return merged


def _check_string_map(resource: _Resource, name: str, where: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _invalid(resource, name, f"metadata.{where}: must be a map of strings")
    if where == "labels":
        for key, label in value.items():
            if not (_valid_label_key(key) and _valid_label_value(label)):
                raise _invalid(resource, name, f"metadata.labels: Invalid value: {key}={label}")


def _validated(
    resource: _Resource, obj: Any, *, generate_name: bool, namespace: str | None = None
) -> JsonObject:
    """A copy of a client's object, fit to store: kind and apiVersion checked and dropped,
    the namespace defaulted (to that of the request's path, if any)."""
    if not isinstance(obj, dict):
        raise _bad_request(f"the body must be a {resource.kind} object")
    for key, expected in (("kind", resource.kind), ("apiVersion", resource.api_version)):
        if obj.get(key) not in (None, expected):
            raise _bad_request(f"{key} {obj.get(key)!r} does not match {expected!r}")
    body = {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("kind", "apiVersion")}
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        raise _invalid(resource, "", "metadata: Required value")
    prefix = metadata.get("generateName")
    if generate_name and not metadata.get("name") and isinstance(prefix, str):
        metadata["name"] = prefix + uuid.uuid4().hex[:5]
    name = metadata.get("name")
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise _invalid(resource, str(name), f"metadata.name: Invalid value: {name!r}")
    if namespace is not None and metadata.setdefault("namespace", namespace) != namespace:
        raise _bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    namespace = metadata.setdefault("namespace", "default")
    if not isinstance(namespace, str) or len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
        raise _invalid(resource, name, f"metadata.namespace: Invalid value: {namespace!r}")
    _check_string_map(resource, name, "labels", metadata.get("labels"))
    _check_string_map(resource, name, "annotations", metadata.get("annotations"))
    return body


_SERVER_MANAGED = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")


# --- the store: objects, one resourceVersion, bounded history --------------------------------


@dataclass(frozen=True)
class _Event:
    """One change, as the history keeps it: the state after, and the state before."""

    resource_version: int
    type: _EventType
    resource: _Resource
    obj: JsonObject
    old: JsonObject | None


def _with_version(obj: JsonObject, resource_version: int) -> JsonObject:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(resource_version)}}


def _key(obj: JsonObject) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


class _Store:
    """Objects by resource, a global resourceVersion and the recent history of changes.

    Stored objects are never mutated, only replaced, so history events and
    watch queues can share them.
    """

    def __init__(self, history_size: int) -> None:
        self.resource_version = _FIRST_RESOURCE_VERSION
        self.oldest = 0
        """Watching from a version below this one is too old: its history is gone."""
        self.watches: set[_Watch] = set()
        self._history: deque[_Event] = deque()
        self._history_size = history_size
        self._objects: dict[_Resource, dict[tuple[str, str], JsonObject]] = {
            resource: {} for resource in _RESOURCES
        }

    def get(self, resource: _Resource, namespace: str, name: str) -> JsonObject | None:
        return self._objects[resource].get((namespace, name))

    def select(self, resource: _Resource, namespace: str | None) -> list[JsonObject]:
        objects = self._objects[resource]
        return [objects[k] for k in sorted(objects) if namespace is None or k[0] == namespace]

    def list_at(
        self, resource: _Resource, namespace: str | None, resource_version: int
    ) -> list[JsonObject]:
        """The objects as they were at `resource_version`, rebuilt by undoing later history."""
        if resource_version < self.oldest:
            raise _too_old(resource_version, self.oldest)
        objects = dict(self._objects[resource])
        for event in reversed(self._history):
            if event.resource_version <= resource_version:
                break
            if event.resource is resource:
                if event.old is None:
                    objects.pop(_key(event.obj), None)
                else:
                    objects[_key(event.old)] = event.old
        return [objects[k] for k in sorted(objects) if namespace is None or k[0] == namespace]

    def write(
        self, resource: _Resource, body: JsonObject, mode: Literal["create", "replace", "apply"]
    ) -> JsonObject:
        """Create or replace a validated object; a replace that changes nothing is no event."""
        metadata = body["metadata"]
        existing = self._objects[resource].get(_key(body))
        if existing is None:
            if mode == "replace":
                raise _not_found(resource, metadata["name"])
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
                metadata.pop(key, None)
            metadata.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
            if resource is _PODS and isinstance(body.setdefault("status", {}), dict):
                body["status"].setdefault("phase", "Pending")
            return self._commit(resource, "ADDED", body, None)
        if mode == "create":
            details = {"name": metadata["name"], "group": resource.group, "kind": resource.plural}
            message = f'{resource.plural} "{metadata["name"]}" already exists'
            raise StatusError(409, "AlreadyExists", message, details)
        current = existing["metadata"]["resourceVersion"]
        if mode == "replace" and metadata.get("resourceVersion") not in (None, "", current):
            message = (
                f'Operation cannot be fulfilled on {resource.plural} "{metadata["name"]}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again"
            )
            raise StatusError(409, "Conflict", message)
        for key in _SERVER_MANAGED:
            metadata.pop(key, None)
            if key in existing["metadata"]:
                metadata[key] = existing["metadata"][key]
        metadata["resourceVersion"] = current
        if body == existing:
            return existing
        return self._commit(resource, "MODIFIED", body, existing)

    def delete(
        self, resource: _Resource, namespace: str, name: str, *, graceful: bool
    ) -> JsonObject:
        """Remove an object (DELETED), or with `graceful` only mark it terminating (MODIFIED)."""
        existing = self._objects[resource].get((namespace, name))
        if existing is None:
            raise _not_found(resource, name)
        if graceful:
            if "deletionTimestamp" in existing["metadata"]:
                return existing
            terminating = copy.deepcopy(existing)
            terminating["metadata"].update(
                deletionTimestamp=_now(), deletionGracePeriodSeconds=_GRACE_PERIOD_SECONDS
            )
            return self._commit(resource, "MODIFIED", terminating, existing)
        return self._commit(resource, "DELETED", existing, existing)

    def compact(self) -> None:
        self._history.clear()
        self.oldest = self.resource_version

    def start_watch(self, watch: _Watch, since: int | None) -> None:
        """Queue what a new watch must see first, then subscribe it to live changes."""
        if since is None:
            for obj in self.select(watch.resource, watch.namespace):
                if watch.matches(obj):
                    watch.push("ADDED", obj)
        elif since < self.oldest:
            raise _too_old(since, self.oldest)
        else:
            for event in self._history:
                if event.resource_version > since:
                    watch.offer(event)
        self.watches.add(watch)

    def _commit(
        self, resource: _Resource, type_: _EventType, obj: JsonObject, old: JsonObject | None
    ) -> JsonObject:
        self.resource_version += 1
        obj = _with_version(obj, self.resource_version)
        if type_ == "DELETED":
            del self._objects[resource][_key(obj)]
        else:
            self._objects[resource][_key(obj)] = obj
        event = _Event(self.resource_version, type_, resource, obj, old)
        self._history.append(event)
        if len(self._history) > self._history_size:
            self.oldest = self._history.popleft().resource_version
        for watch in self.watches:
            watch.offer(event)
        return obj


# --- watches ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TableFormat:
    """kubectl's ask for server-side printing: which Table version, how much of each object."""

    api_version: str
    include_object: str

    def table(self, resource: _Resource, objects: Iterable[JsonObject], version: int) -> JsonObject:
        return {
            "kind": "Table",
            "apiVersion": self.api_version,
            "metadata": {"resourceVersion": str(version)},
            "columnDefinitions": list(resource.columns),
            "rows": [self._row(resource, obj) for obj in objects],
        }

    def _row(self, resource: _Resource, obj: JsonObject) -> JsonObject:
        row: JsonObject = {"cells": resource.cells(obj)}
        if self.include_object == "Object":
            row["object"] = resource.typed(obj)
        elif self.include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        return row


@dataclass(eq=False)
class _Watch:
    """One open watch stream: what it selects, what it still has to send, how it must end."""

    resource: _Resource
    namespace: str | None
    labels: tuple[_Requirement, ...]
    fields: tuple[_FieldRequirement, ...]
    table: _TableFormat | None
    transport: asyncio.BaseTransport | None
    pending: deque[tuple[str, JsonObject]] = field(default_factory=deque)
    ending: _Ending | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def matches(self, obj: JsonObject) -> bool:
        if self.namespace is not None and obj["metadata"]["namespace"] != self.namespace:
            return False
        labels = _labels(obj)
        return all(r.matches(labels) for r in self.labels) and all(
            f.matches(obj) for f in self.fields
        )

    def push(self, type_: str, obj: JsonObject) -> None:
        self.pending.append((type_, obj))
        self.wake.set()

    def offer(self, event: _Event) -> None:
        """Queue `event` as this watch sees it: a selector the object leaves or enters turns
        a modification into DELETED (the previous state at the new version) or ADDED."""
        if event.resource is not self.resource:
            return
        now = event.type != "DELETED" and self.matches(event.obj)
        before = event.old is not None and self.matches(event.old)
        if now:
            self.push("MODIFIED" if before else "ADDED", event.obj)
        elif before and event.old is not None:
            self.push("DELETED", _with_version(event.old, event.resource_version))

    def end(self, how: _Ending) -> None:
        self.ending = self.ending or how
        self.wake.set()

    def encode(self, type_: str, obj: JsonObject) -> bytes:
        if self.table is not None:
            version = int(obj["metadata"]["resourceVersion"])
            wrapped = self.table.table(self.resource, [obj], version)
        else:
            wrapped = self.resource.typed(obj)
        return _json_line({"type": type_, "object": wrapped})


def _json_line(body: JsonObject) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def _reset(transport: asyncio.BaseTransport | None) -> None:
    """Close a connection with a TCP RST rather than a FIN."""
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if isinstance(transport, asyncio.WriteTransport):
        transport.abort()
    else:
        transport.close()


# --- request parsing -------------------------------------------------------------------------


def _parse_bool(name: str, value: str | None) -> bool:
    if value is None or value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise _bad_request(f"{name}: invalid boolean {value!r}")


def _parse_version(value: str | None) -> int | None:
    """A request's resourceVersion: None when absent, empty or "0" ("any version")."""
    if not value or value == "0":
        return None
    if not _NUMBER.fullmatch(value):
        raise _bad_request(f"resourceVersion: Invalid value: {value!r}: must be a number")
    return int(value)


def _table_format(request: web.Request) -> _TableFormat | None:
    """The Table version the Accept header prefers over plain JSON, if any."""
    for media_range in request.headers.get("Accept", "").split(","):
        media_type, *params = (part.strip() for part in media_range.split(";"))
        options = {key: value for key, _, value in (p.partition("=") for p in params)}
        if options.get("as") == "Table" and options.get("g") == "meta.k8s.io":
            if options.get("v") in ("v1", "v1beta1"):
                include = request.query.get("includeObject", "Metadata")
                return _TableFormat(f"meta.k8s.io/{options['v']}", include)
        elif "as" not in options and media_type in ("application/json", "*/*", "application/*"):
            return None
    return None


async def _json_body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (ValueError, RecursionError) as exc:
        raise _bad_request(f"the request body is not valid JSON: {exc}") from exc


def _json_response(body: JsonObject, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
    )


def _status_response(error: StatusError) -> web.Response:
    return _json_response(error.to_status(), error.code)


# --- the server ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiServerSimConfig:
    """Where the emulator listens and how it paces bookmarks and keeps history."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port; `ApiServerSim.port` tells which."""
    bookmark_interval: float = 60.0
    """Seconds between BOOKMARK events on watches that allow them (the real server: ~60 s)."""
    history_size: int = 1000
    """Changes kept for watches to resume from; older versions answer 410 Expired."""

    def __post_init__(self) -> None:
        if self.bookmark_interval <= 0:
            raise ValueError("bookmark_interval must be positive")
        if self.history_size < 0:
            raise ValueError("history_size must not be negative")


class ApiServerSim:
    """A running emulator: its address, its objects and the faults it can inject.

    Start it with `start_apiserver` or `running_apiserver`. The methods are not
    thread-safe: call them on the loop that runs the server.
    """

    def __init__(self, config: ApiServerSimConfig) -> None:
        self.config = config
        self.port = config.port
        self._store = _Store(config.history_size)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._stalled = False
        self._blackholed = False
        self._unblocked = asyncio.Event()
        self._unblocked.set()
        self._auto_restore: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        host = self.config.host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

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
        kind = obj.get("kind")
        resource = _BY_KIND.get(kind) if isinstance(kind, str) else None
        if resource is None:
            raise _bad_request(f"kind must be one of {sorted(_BY_KIND)}, not {obj.get('kind')!r}")
        return self._apply(resource, obj)

    def apply_pod(self, pod: JsonObject) -> JsonObject:
        """`apply` for a Pod, e.g. ``sim.apply_pod(make_pod("engine-0", ready=False))``."""
        return self._apply(_PODS, pod)

    def apply_service(self, service: JsonObject) -> JsonObject:
        """`apply` for a Service."""
        return self._apply(_SERVICES, service)

    def apply_endpointslice(self, endpoint_slice: JsonObject) -> JsonObject:
        """`apply` for an EndpointSlice."""
        return self._apply(_ENDPOINTSLICES, endpoint_slice)

    def patch(self, kind: Kind, namespace: str, name: str, patch: JsonObject) -> JsonObject:
        """Apply a JSON merge patch, e.g. ``{"metadata": {"labels": {"sleeping": "true"}}}``;
        a null value removes a key."""
        resource = _BY_KIND[kind]
        existing = self._store.get(resource, namespace, name)
        if existing is None:
            raise _not_found(resource, name)
        merged = _merge_patch(resource.typed(existing), patch)
        if _field(merged, "metadata", "name") != name or (
            _field(merged, "metadata", "namespace") != namespace
        ):
            raise _bad_request("a patch cannot change an object's name or namespace")
        body = _validated(resource, merged, generate_name=False)
        return resource.typed(copy.deepcopy(self._store.write(resource, body, "replace")))

    def delete(self, kind: Kind, namespace: str, name: str, *, graceful: bool = False) -> None:
        """Delete at once (DELETED); `graceful` only sets deletionTimestamp (MODIFIED), as a
        kubelet still stopping the pod, and a later plain delete finishes it. A missing
        object raises `StatusError` 404."""
        self._store.delete(_BY_KIND[kind], namespace, name, graceful=graceful)

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
        resource = _BY_KIND[kind]
        obj = self._store.get(resource, namespace, name)
        return None if obj is None else resource.typed(copy.deepcopy(obj))

    def objects(self, kind: Kind, namespace: str | None = None) -> list[JsonObject]:
        """The truth, for assertions: every object of a kind, by namespace and name."""
        resource = _BY_KIND[kind]
        return [resource.typed(copy.deepcopy(o)) for o in self._store.select(resource, namespace)]

    def pods(self, namespace: str | None = None) -> list[JsonObject]:
        """`objects` for Pods."""
        return self.objects("Pod", namespace)

    def _apply(self, resource: _Resource, obj: JsonObject) -> JsonObject:
        body = _validated(resource, obj, generate_name=True)
        return resource.typed(copy.deepcopy(self._store.write(resource, body, "apply")))

    # faults

    async def drop_watches(self, *, reset: bool = False) -> None:
        """End every open watch: a clean end of the chunked stream, or a TCP reset."""
        watches = list(self._store.watches)
        for watch in watches:
            if reset:
                _reset(watch.transport)
            watch.end("abort" if reset else "eof")
        await _finished(watches)

    async def refuse(self) -> None:
        """Stop listening (new connections: ECONNREFUSED) and drop every connection."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        server = self._runner.server if self._runner is not None else None
        for connection in server.connections if server is not None else ():
            if connection.transport is not None:
                connection.transport.abort()
        watches = list(self._store.watches)
        for watch in watches:
            watch.end("abort")
        await _finished(watches)

    async def blackhole(self) -> None:
        """Accept connections and read requests but never answer; open watches go silent."""
        self._blackholed = True
        self._unblocked.clear()
        self._wake_watches()

    def stall(self) -> None:
        """Watch streams, open and new, send nothing at all (not even bookmarks); LISTs answer."""
        self._stalled = True
        self._wake_watches()

    async def restore(self) -> None:
        """Undo refuse, blackhole and stall: listen again on the same port, answer, stream."""
        if self._auto_restore is not None:
            self._auto_restore.cancel()
            self._auto_restore = None
        self._stalled = self._blackholed = False
        self._unblocked.set()
        if self._site is None and self._runner is not None:
            await self._listen()
        self._wake_watches()

    def compact(self) -> None:
        """Forget all history: watching (or an Exact list) from any older version gets 410."""
        self._store.compact()

    async def stop(self) -> None:
        """End every watch cleanly and close the server."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._auto_restore is not None:
            self._auto_restore.cancel()
        for task in self._tasks:
            task.cancel()
        self._stalled = self._blackholed = False
        self._unblocked.set()
        watches = list(self._store.watches)
        for watch in watches:
            watch.end("eof")
        await _finished(watches)
        self._site = None
        await runner.cleanup()

    async def _start(self) -> None:
        app = web.Application(middlewares=[self._answer_errors, self._hold_when_blackholed])
        add = app.router.add_route
        add("GET", "/version", self._version)
        add("GET", "/api", self._api_versions)
        add("GET", "/api/v1", self._core_resources)
        add("GET", "/apis", self._api_groups)
        add("GET", "/apis/{group}", self._api_group)
        add("GET", "/apis/{group}/{version}", self._group_resources)
        for path in ("/healthz", "/livez", "/readyz"):
            add("GET", path, self._ok)
        for root in ("/api/{version}", "/apis/{group}/{version}"):
            add("*", root + "/{plural}", self._collection)
            add("*", root + "/namespaces/{namespace}/{plural}", self._collection)
            add("*", root + "/namespaces/{namespace}/{plural}/{name}", self._item)
        add("GET", "/_sim/state", self._sim_state)
        add("POST", "/_sim/faults/{fault}", self._sim_fault)
        add("PUT", "/_sim/objects", self._sim_apply)
        add("*", "/_sim/objects/{plural}/{namespace}/{name}", self._sim_object)
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.config.host, self.port, reuse_address=True)
        await site.start()
        self._site = site
        self.port = site.port

    def _wake_watches(self) -> None:
        for watch in self._store.watches:
            watch.wake.set()

    @property
    def _silenced(self) -> bool:
        return self._stalled or self._blackholed

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # middleware

    @web.middleware
    async def _answer_errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except StatusError as error:
            return _status_response(error)
        except web.HTTPNotFound:
            return _status_response(_NO_SUCH_RESOURCE)
        except web.HTTPMethodNotAllowed:
            message = (
                f"the server does not allow this method on the requested resource: {request.method}"
            )
            return _status_response(StatusError(405, "MethodNotAllowed", message))
        except web.HTTPException as exc:
            return _status_response(
                StatusError(exc.status, exc.reason.replace(" ", ""), exc.text or exc.reason)
            )
        except Exception:
            _log.exception("sim apiserver: %s %s failed", request.method, request.path_qs)
            return _status_response(StatusError(500, "InternalError", "internal error"))

    @web.middleware
    async def _hold_when_blackholed(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        if not request.path.startswith("/_sim/"):
            await self._unblocked.wait()
        return await handler(request)

    # discovery

    async def _version(self, request: web.Request) -> web.Response:
        major, minor, _ = _GIT_VERSION.lstrip("v").split(".")
        return _json_response(
            {
                "major": major,
                "minor": minor,
                "gitVersion": _GIT_VERSION,
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2024-04-17T17:27:03Z",
                "goVersion": "go1.22.2",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

    async def _api_versions(self, request: web.Request) -> web.Response:
        address = {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.config.host}:{self.port}"}
        return _json_response(
            {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [address]}
        )

    async def _core_resources(self, request: web.Request) -> web.Response:
        resources = [r.discovery_entry() for r in _RESOURCES if not r.group]
        return _json_response(
            {"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}
        )

    async def _api_groups(self, request: web.Request) -> web.Response:
        groups = [_group_document(group) for group in _GROUPS]
        return _json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def _api_group(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        if group not in _GROUPS:
            raise _NO_SUCH_RESOURCE
        return _json_response({"kind": "APIGroup", "apiVersion": "v1", **_group_document(group)})

    async def _group_resources(self, request: web.Request) -> web.Response:
        group, version = request.match_info["group"], request.match_info["version"]
        resources = [r for r in _RESOURCES if r.group == group and r.version == version]
        if not resources:
            raise _NO_SUCH_RESOURCE
        return _json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}",
                "resources": [r.discovery_entry() for r in resources],
            }
        )

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # the resource API

    def _resource(self, request: web.Request) -> _Resource:
        info = request.match_info
        resource = _BY_PATH.get((info.get("group", ""), info["version"], info["plural"]))
        if resource is None:
            raise _NO_SUCH_RESOURCE
        return resource

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        resource = self._resource(request)
        namespace = request.match_info.get("namespace")
        if request.method == "GET":
            if _parse_bool("watch", request.query.get("watch")):
                return await self._watch(request, resource, namespace)
            return self._list(request, resource, namespace)
        if request.method == "POST" and namespace is not None:
            body = await _json_body(request)
            body = _validated(resource, body, generate_name=True, namespace=namespace)
            created = self._store.write(resource, body, "create")
            return _json_response(resource.typed(created), 201)
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])

    async def _item(self, request: web.Request) -> web.StreamResponse:
        resource = self._resource(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if request.method == "GET":
            obj = self._store.get(resource, namespace, name)
            if obj is None:
                raise _not_found(resource, name)
            table = _table_format(request)
            if table is not None:
                version = int(obj["metadata"]["resourceVersion"])
                return _json_response(table.table(resource, [obj], version))
            return _json_response(resource.typed(obj))
        if request.method == "PUT":
            body = await _json_body(request)
            body = _validated(resource, body, generate_name=False, namespace=namespace)
            if body["metadata"]["name"] != name:
                raise _bad_request(
                    f"the name of the object ({body['metadata']['name']}) does not match the "
                    f"name on the URL ({name})"
                )
            return _json_response(resource.typed(self._store.write(resource, body, "replace")))
        if request.method == "PATCH":
            return _json_response(await self._patch_request(request, resource, namespace, name))
        if request.method == "DELETE":
            return _json_response(
                resource.typed(self._store.delete(resource, namespace, name, graceful=False))
            )
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "PUT", "PATCH", "DELETE"])

    async def _patch_request(
        self, request: web.Request, resource: _Resource, namespace: str, name: str
    ) -> JsonObject:
        if request.content_type not in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            message = f"the body of the request was in an unknown format: {request.content_type}"
            raise StatusError(415, "UnsupportedMediaType", message)
        patch = await _json_body(request)
        if not isinstance(patch, dict):
            raise _bad_request("a merge patch must be a JSON object")
        return self.patch(resource.kind, namespace, name, patch)

    def _list(
        self, request: web.Request, resource: _Resource, namespace: str | None
    ) -> web.Response:
        labels = _parse_label_selector(request.query.get("labelSelector", ""))
        fields = _parse_field_selector(request.query.get("fieldSelector", ""), resource)
        version = _parse_version(request.query.get("resourceVersion"))
        match = request.query.get("resourceVersionMatch")
        if match not in (None, "", "NotOlderThan", "Exact"):
            raise _bad_request(f"resourceVersionMatch: Unsupported value: {match!r}")
        if match == "Exact" and version is not None:
            objects = self._store.list_at(resource, namespace, version)
        else:
            objects, version = self._store.select(resource, namespace), None
        version = version or self._store.resource_version
        selected = [
            obj
            for obj in objects
            if all(r.matches(_labels(obj)) for r in labels) and all(f.matches(obj) for f in fields)
        ]
        table = _table_format(request)
        if table is not None:
            return _json_response(table.table(resource, selected, version))
        return _json_response(
            {
                "kind": f"{resource.kind}List",
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(version)},
                "items": selected,
            }
        )

    async def _watch(
        self, request: web.Request, resource: _Resource, namespace: str | None
    ) -> web.StreamResponse:
        query = request.query
        timeout = query.get("timeoutSeconds")
        if timeout is not None and not _NUMBER.fullmatch(timeout):
            raise _bad_request(f"timeoutSeconds: Invalid value: {timeout!r}")
        watch = _Watch(
            resource=resource,
            namespace=namespace,
            labels=_parse_label_selector(query.get("labelSelector", "")),
            fields=_parse_field_selector(query.get("fieldSelector", ""), resource),
            table=_table_format(request),
            transport=request.transport,
        )
        bookmarks = _parse_bool("allowWatchBookmarks", query.get("allowWatchBookmarks"))
        since = _parse_version(query.get("resourceVersion"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            self._store.start_watch(watch, since)
        except StatusError as expired:
            await response.prepare(request)
            await response.write(_json_line({"type": "ERROR", "object": expired.to_status()}))
            await response.write_eof()
            return response
        try:
            while self._silenced and watch.ending is None:
                await self._doze(watch, None)
            await response.prepare(request)
            await self._stream(watch, response, bookmarks, int(timeout) if timeout else None)
        except ConnectionError:
            watch.ending = "abort"
        finally:
            self._store.watches.discard(watch)
            watch.finished.set()
        return response

    async def _stream(
        self, watch: _Watch, response: web.StreamResponse, bookmarks: bool, timeout: int | None
    ) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.bookmark_interval
        deadline = loop.time() + timeout if timeout else None
        next_bookmark = loop.time() + interval if bookmarks else None
        while True:
            watch.wake.clear()
            if watch.ending is not None:
                break
            if self._silenced:
                await self._doze(watch, None)
                continue
            if watch.pending:
                await response.write(watch.encode(*watch.pending.popleft()))
                continue
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            if next_bookmark is not None and now >= next_bookmark:
                await response.write(self._bookmark(watch.resource))
                next_bookmark = now + interval
                continue
            wakeups = [t for t in (deadline, next_bookmark) if t is not None]
            await self._doze(watch, min(wakeups) - now if wakeups else None)
        if watch.ending != "abort":
            await response.write_eof()

    async def _doze(self, watch: _Watch, seconds: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watch.wake.wait(), seconds)
        watch.wake.clear()

    def _bookmark(self, resource: _Resource) -> bytes:
        metadata = {"resourceVersion": str(self._store.resource_version)}
        return _json_line({"type": "BOOKMARK", "object": resource.typed({"metadata": metadata})})

    # the admin API

    async def _sim_state(self, request: web.Request) -> web.Response:
        return _json_response(
            {
                "resourceVersion": str(self._store.resource_version),
                "oldestResourceVersion": str(self._store.oldest),
                "openWatches": self.open_watches,
                "stalled": self._stalled,
                "blackholed": self._blackholed,
            }
        )

    async def _sim_fault(self, request: web.Request) -> web.StreamResponse:
        fault = request.match_info["fault"]
        options = await _json_body(request) if request.can_read_body else {}
        if not isinstance(options, dict):
            raise _bad_request("the body must be a JSON object")
        if fault == "drop-watches":
            await self.drop_watches(reset=options.get("reset") is True)
        elif fault == "refuse":
            return await self._refuse_request(request, options.get("seconds"))
        elif fault == "blackhole":
            await self.blackhole()
        elif fault == "stall":
            self.stall()
        elif fault == "compact":
            self.compact()
        elif fault == "restore":
            await self.restore()
        else:
            raise StatusError(404, "NotFound", f"no such fault: {fault!r}")
        return await self._sim_state(request)

    async def _refuse_request(self, request: web.Request, seconds: Any) -> web.StreamResponse:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            seconds = 0  # refused below, like a NaN or a negative number
        if not 0 < seconds <= 3600:
            raise _bad_request(
                'refuse needs {"seconds": N}, 0 < N <= 3600: nothing could restore it over HTTP'
            )
        response = _json_response({"refusingForSeconds": seconds})
        await response.prepare(request)
        await response.write_eof()  # answered before the connection goes with the rest
        self._spawn(self.refuse())
        loop = asyncio.get_running_loop()
        self._auto_restore = loop.call_later(seconds, lambda: self._spawn(self.restore()))
        return response

    async def _sim_apply(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise _bad_request("the body must be an object with a kind")
        return _json_response(self.apply(body))

    async def _sim_object(self, request: web.Request) -> web.Response:
        info = request.match_info
        resource = _BY_PLURAL.get(info["plural"])
        if resource is None:
            raise _NO_SUCH_RESOURCE
        namespace, name = info["namespace"], info["name"]
        if request.method == "PATCH":
            patch = await _json_body(request)
            if not isinstance(patch, dict):
                raise _bad_request("a merge patch must be a JSON object")
            return _json_response(self.patch(resource.kind, namespace, name, patch))
        if request.method == "DELETE":
            graceful = _parse_bool("graceful", request.query.get("graceful"))
            self.delete(resource.kind, namespace, name, graceful=graceful)
            return await self._sim_state(request)
        raise web.HTTPMethodNotAllowed(request.method, ["PATCH", "DELETE"])


def _group_document(group: str) -> JsonObject:
    versions = [
        {"groupVersion": r.api_version, "version": r.version}
        for r in _RESOURCES
        if r.group == group
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


async def _finished(watches: Sequence[_Watch]) -> None:
    waits = [asyncio.ensure_future(watch.finished.wait()) for watch in watches]
    if not waits:
        return
    _, late = await asyncio.wait(waits, timeout=_FINISH_TIMEOUT)
    for wait in late:
        wait.cancel()


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


# --- builders for realistic objects ----------------------------------------------------------


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    ip: str | None = "127.0.0.1",
    ready: bool = True,
    phase: str = "Running",
    port: int = 8000,
    node: str = "sim-node",
) -> JsonObject:
    """A Pod as a running cluster reports it: scheduled, one container, the Ready condition."""
    now = _now()
    state: JsonObject = (
        {"running": {"startedAt": now}}
        if phase == "Running"
        else {"waiting": {"reason": "ContainerCreating"}}
    )
    condition = "True" if ready else "False"
    status: JsonObject = {
        "phase": phase,
        "hostIP": "10.0.0.1",
        "startTime": now,
        "conditions": [
            {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": now}
            for kind, value in (
                ("Initialized", "True"),
                ("Ready", condition),
                ("ContainersReady", condition),
                ("PodScheduled", "True"),
            )
        ],
        "containerStatuses": [
            {
                "name": "engine",
                "image": "vllm/vllm-openai:latest",
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "started": phase == "Running",
                "state": state,
            }
        ],
    }
    if ip is not None:
        status.update(podIP=ip, podIPs=[{"ip": ip}])
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "containers": [
                {
                    "name": "engine",
                    "image": "vllm/vllm-openai:latest",
                    "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
                }
            ],
        },
        "status": status,
    }


def make_service(
    name: str,
    *,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    selector: Mapping[str, str] | None = None,
    ports: Sequence[int] = (8000,),
    cluster_ip: str = "10.96.0.10",
    type: str = "ClusterIP",
) -> JsonObject:
    """A Service; `selector` defaults to `labels`. Ports are named "http", then "http-PORT"."""
    return {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "type": type,
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "selector": dict(selector if selector is not None else labels or {}),
            "ports": [
                {
                    "name": "http" if i == 0 else f"http-{port}",
                    "port": port,
                    "targetPort": port,
                    "protocol": "TCP",
                }
                for i, port in enumerate(ports)
            ],
        },
    }


def make_endpointslice(
    service_name: str,
    endpoints: Sequence[tuple[str, bool]] = (),
    port: int = 8000,
    *,
    namespace: str = "default",
    name: str | None = None,
    port_name: str = "http",
) -> JsonObject:
    """An EndpointSlice of a Service: one endpoint per ``(ip, ready)``, one port.

    Named ``{service_name}-slice`` unless `name` says otherwise, so applying it
    again replaces it.
    """
    ipv6 = any(":" in ip for ip, _ in endpoints)
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name or f"{service_name}-slice",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service_name,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv6" if ipv6 else "IPv4",
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
            }
            for ip, ready in endpoints
        ],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


# --- command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``headcount sim-apiserver``."""
    defaults = ApiServerSimConfig()
    parser.add_argument("--host", default=defaults.host, help="address to listen on")
    parser.add_argument("--port", type=int, default=defaults.port, help="0: any free port")
    parser.add_argument(
        "--kubeconfig-out", type=Path, default=None, help="write a kubeconfig for it here"
    )
    parser.add_argument(
        "--bookmark-interval",
        type=float,
        default=defaults.bookmark_interval,
        help="seconds between watch bookmarks",
    )
    parser.add_argument(
        "--history-size",
        type=int,
        default=defaults.history_size,
        help="changes kept for watches to resume from",
    )


def config_from_args(args: argparse.Namespace) -> ApiServerSimConfig:
    return ApiServerSimConfig(
        host=args.host,
        port=args.port,
        bookmark_interval=args.bookmark_interval,
        history_size=args.history_size,
    )


async def serve_forever(config: ApiServerSimConfig, kubeconfig_out: Path | None = None) -> None:
    """Serve until SIGINT or SIGTERM (or cancellation), printing the URL once listening."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)
    try:
        async with running_apiserver(config) as sim:
            if kubeconfig_out is not None:
                sim.kubeconfig(kubeconfig_out)
            where = f" (kubeconfig: {kubeconfig_out})" if kubeconfig_out is not None else ""
            print(f"sim-apiserver serving {sim.url}{where}", flush=True)
            await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signum)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m headcount.sim.apiserver``."""
    parser = argparse.ArgumentParser(
        prog="python -m headcount.sim.apiserver", description="An emulated Kubernetes API server."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    asyncio.run(serve_forever(config_from_args(args), args.kubeconfig_out))


if __name__ == "__main__":
    main()
