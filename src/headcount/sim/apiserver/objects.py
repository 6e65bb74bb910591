"""Kubernetes objects as plain JSON, read defensively, since what a client sent may be malformed."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "JsonObject",
    "as_list",
    "dicts",
    "field",
    "key_of",
    "labels_of",
    "merge_patch",
    "timestamp",
    "with_version",
]

JsonObject = dict[str, Any]


def field(obj: Mapping[str, Any], *path: str) -> Any:
    """The value at a dotted path, or None wherever the object is missing or malformed."""
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def dicts(value: Any) -> list[Mapping[str, Any]]:
    """The mappings in a list field, ignoring a malformed field or malformed items."""
    return [item for item in as_list(value) if isinstance(item, Mapping)]


def labels_of(obj: JsonObject) -> Mapping[str, str]:
    labels = field(obj, "metadata", "labels")
    return labels if isinstance(labels, Mapping) else {}


def timestamp() -> str:
    """Now, as Kubernetes writes times: UTC, to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: mappings merge, a null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def with_version(obj: JsonObject, resource_version: int) -> JsonObject:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(resource_version)}}


def key_of(obj: JsonObject) -> tuple[str, str]:
    """Where a stored object lives: its namespace and name."""
    return obj["metadata"]["namespace"], obj["metadata"]["name"]
