"""What the emulator accepts as an object, as the real server validates names, labels and kinds.

A client bug the real server would refuse (a label value with a space, a
body of the wrong kind, an InferencePool without ports) must fail here too, not
only in production.
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import Any

from headcount.pool_spec import pool_target
from headcount.selectors import valid_label_key, valid_label_value
from headcount.sim.apiserver.objects import JsonObject
from headcount.sim.apiserver.resources import INFERENCEPOOLS, Resource
from headcount.sim.apiserver.status import bad_request, invalid

__all__ = ["validated"]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _check_string_map(resource: Resource, name: str, where: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise invalid(resource, name, f"metadata.{where}: must be a map of strings")
    if where == "labels":
        for key, label in value.items():
            if not (valid_label_key(key) and valid_label_value(label)):
                raise invalid(resource, name, f"metadata.labels: Invalid value: {key}={label}")


def validated(
    resource: Resource, obj: Any, *, generate_name: bool, namespace: str | None = None
) -> JsonObject:
    """A copy of a client's object, fit to store: kind and apiVersion checked and dropped,
    the namespace defaulted (to that of the request's path, if any)."""
    if not isinstance(obj, dict):
        raise bad_request(f"the body must be a {resource.kind} object")
    for key, expected in (("kind", resource.kind), ("apiVersion", resource.api_version)):
        if obj.get(key) not in (None, expected):
            raise bad_request(f"{key} {obj.get(key)!r} does not match {expected!r}")
    body = {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("kind", "apiVersion")}
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        raise invalid(resource, "", "metadata: Required value")
    prefix = metadata.get("generateName")
    if generate_name and not metadata.get("name") and isinstance(prefix, str):
        metadata["name"] = prefix + uuid.uuid4().hex[:5]
    name = metadata.get("name")
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise invalid(resource, str(name), f"metadata.name: Invalid value: {name!r}")
    if namespace is not None and metadata.setdefault("namespace", namespace) != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    namespace = metadata.setdefault("namespace", "default")
    if not isinstance(namespace, str) or len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
        raise invalid(resource, name, f"metadata.namespace: Invalid value: {namespace!r}")
    _check_string_map(resource, name, "labels", metadata.get("labels"))
    _check_string_map(resource, name, "annotations", metadata.get("annotations"))
    if resource is INFERENCEPOOLS:
        try:
            pool_target(body)
        except ValueError as exc:
            raise invalid(resource, name, str(exc)) from None
    return body
