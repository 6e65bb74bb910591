"""The emulator's state: objects by resource, one global resourceVersion, a bounded history.

Watches resume from a resourceVersion by replaying the history after it; a
version older than the history answers 410 Expired, which a client survives
only by listing again. Both behaviours are the contract discovery is tested
against.
"""

from __future__ import annotations

import copy
import uuid
from collections import deque
from collections.abc import Callable
from typing import Literal

from headcount.sim.apiserver.events import Event, EventType
from headcount.sim.apiserver.objects import JsonObject, key_of, timestamp, with_version
from headcount.sim.apiserver.resources import PODS, RESOURCES, Resource
from headcount.sim.apiserver.status import StatusError, not_found, too_old
from headcount.sim.apiserver.watch import Watch

__all__ = ["Store"]

_FIRST_RESOURCE_VERSION = 1
_GRACE_PERIOD_SECONDS = 30
_SERVER_MANAGED = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")


class Store:
    """Objects by resource, a global resourceVersion and the recent history of changes.

    Stored objects are never mutated, only replaced, so history events and
    watch queues can share them.
    """

    def __init__(self, history_size: int) -> None:
        self.resource_version = _FIRST_RESOURCE_VERSION
        self.oldest = 0
        """Watching from a version below this one is too old: its history is gone."""
        self.watches: set[Watch] = set()
        self.observers: list[Callable[[Event], None]] = []
        """Called with every change after the watches have it (the simulated kubelet)."""
        self._history: deque[Event] = deque()
        self._history_size = history_size
        self._objects: dict[Resource, dict[tuple[str, str], JsonObject]] = {
            resource: {} for resource in RESOURCES
        }

    def get(self, resource: Resource, namespace: str, name: str) -> JsonObject | None:
        return self._objects[resource].get((namespace, name))

    def select(self, resource: Resource, namespace: str | None) -> list[JsonObject]:
        objects = self._objects[resource]
        return [objects[k] for k in sorted(objects) if namespace is None or k[0] == namespace]

    def list_at(
        self, resource: Resource, namespace: str | None, resource_version: int
    ) -> list[JsonObject]:
        """The objects as they were at `resource_version`, rebuilt by undoing later history."""
        if resource_version < self.oldest:
            raise too_old(resource_version, self.oldest)
        objects = dict(self._objects[resource])
        for event in reversed(self._history):
            if event.resource_version <= resource_version:
                break
            if event.resource is resource:
                if event.old is None:
                    objects.pop(key_of(event.obj), None)
                else:
                    objects[key_of(event.old)] = event.old
        return [objects[k] for k in sorted(objects) if namespace is None or k[0] == namespace]

    def write(
        self, resource: Resource, body: JsonObject, mode: Literal["create", "replace", "apply"]
    ) -> JsonObject:
        """Create or replace a validated object; a replace that changes nothing is no event."""
        metadata = body["metadata"]
        existing = self._objects[resource].get(key_of(body))
        if existing is None:
            if mode == "replace":
                raise not_found(resource, metadata["name"])
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
                metadata.pop(key, None)
            metadata.update(uid=str(uuid.uuid4()), creationTimestamp=timestamp())
            if resource is PODS and isinstance(body.setdefault("status", {}), dict):
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
        self, resource: Resource, namespace: str, name: str, *, graceful: bool
    ) -> JsonObject:
        """Remove an object (DELETED), or with `graceful` only mark it terminating (MODIFIED)."""
        existing = self._objects[resource].get((namespace, name))
        if existing is None:
            raise not_found(resource, name)
        if graceful:
            if "deletionTimestamp" in existing["metadata"]:
                return existing
            terminating = copy.deepcopy(existing)
            terminating["metadata"].update(
                deletionTimestamp=timestamp(), deletionGracePeriodSeconds=_GRACE_PERIOD_SECONDS
            )
            return self._commit(resource, "MODIFIED", terminating, existing)
        return self._commit(resource, "DELETED", existing, existing)

    def compact(self) -> None:
        self._history.clear()
        self.oldest = self.resource_version

    def start_watch(self, watch: Watch, since: int | None) -> None:
        """Queue what a new watch must see first, then subscribe it to live changes."""
        if since is None:
            for obj in self.select(watch.resource, watch.namespace):
                if watch.matches(obj):
                    watch.push("ADDED", obj)
        elif since < self.oldest:
            raise too_old(since, self.oldest)
        else:
            for event in self._history:
                if event.resource_version > since:
                    watch.offer(event)
        self.watches.add(watch)

    def _commit(
        self, resource: Resource, type_: EventType, obj: JsonObject, old: JsonObject | None
    ) -> JsonObject:
        self.resource_version += 1
        obj = with_version(obj, self.resource_version)
        if type_ == "DELETED":
            del self._objects[resource][key_of(obj)]
        else:
            self._objects[resource][key_of(obj)] = obj
        event = Event(self.resource_version, type_, resource, obj, old)
        self._history.append(event)
        if len(self._history) > self._history_size:
            self.oldest = self._history.popleft().resource_version
        for watch in self.watches:
            watch.offer(event)
        for observe in self.observers:
            observe(event)
        return obj
