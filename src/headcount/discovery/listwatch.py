"""The Kubernetes API as a reflector needs it: raw objects, watch events, list and watch.

`kube.py` implements `ListerWatcher` over the real client; tests script a fake.
Objects stay parsed JSON, never client models: mapping them is the sources' job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["KubeObject", "ListerWatcher", "WatchEvent", "object_key"]

KubeObject = Mapping[str, Any]
"""A Kubernetes object as the API server sends it: parsed JSON, never a client model."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED, BOOKMARK (or a type we do not know)."""

    type: str
    object: KubeObject


class ListerWatcher(Protocol):
    """The Kubernetes API as a reflector needs it: one resource, one namespace."""

    async def list(self, label_selector: str) -> tuple[list[KubeObject], str]:
        """Every matching object and the list's resourceVersion (a consistent, fresh read)."""
        ...

    def watch(
        self, resource_version: str, timeout_seconds: int, label_selector: str
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Open a watch from `resource_version`; entering connects, iterating reads events.

        The iterator ends when the server ends the stream and raises a `KubeError`
        otherwise (`WatchExpired` also for an in-stream ERROR event with code 410).
        """
        ...

    async def reachable(self) -> bool:
        """Whether the API server answers at all, quickly; never raises."""
        ...


def object_key(obj: KubeObject) -> tuple[str, str]:
    """(uid, resourceVersion) of an object, empty strings where it has none."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(metadata, Mapping):
        return "", ""
    return str(metadata.get("uid") or ""), str(metadata.get("resourceVersion") or "")
