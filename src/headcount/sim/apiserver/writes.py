"""Writes through the emulator's own APIs (Python and ``/_sim/``): validated, stored, copied out.

Tests set the cluster up with these, so they pass the same checks as a
client's request and answer with a copy the caller may change freely.
"""

from __future__ import annotations

import copy

from headcount.sim.apiserver.objects import JsonObject, field, merge_patch
from headcount.sim.apiserver.resources import BY_KIND, Resource
from headcount.sim.apiserver.status import bad_request, not_found
from headcount.sim.apiserver.store import Store
from headcount.sim.apiserver.validation import validated

__all__ = ["apply", "apply_as", "patch"]


def apply(store: Store, obj: JsonObject) -> JsonObject:
    """Create or replace an object whose ``kind`` says what it is; return it as stored."""
    kind = obj.get("kind")
    resource = BY_KIND.get(kind) if isinstance(kind, str) else None
    if resource is None:
        raise bad_request(f"kind must be one of {sorted(BY_KIND)}, not {obj.get('kind')!r}")
    return apply_as(store, resource, obj)


def apply_as(store: Store, resource: Resource, obj: JsonObject) -> JsonObject:
    """Create or replace an object of `resource`; return it as stored."""
    body = validated(resource, obj, generate_name=True)
    return resource.typed(copy.deepcopy(store.write(resource, body, "apply")))


def patch(
    store: Store, resource: Resource, namespace: str, name: str, patch: JsonObject
) -> JsonObject:
    """Apply a JSON merge patch to an existing object; return it as stored."""
    existing = store.get(resource, namespace, name)
    if existing is None:
        raise not_found(resource, name)
    merged = merge_patch(resource.typed(existing), patch)
    if field(merged, "metadata", "name") != name or (
        field(merged, "metadata", "namespace") != namespace
    ):
        raise bad_request("a patch cannot change an object's name or namespace")
    body = validated(resource, merged, generate_name=False)
    return resource.typed(copy.deepcopy(store.write(resource, body, "replace")))
