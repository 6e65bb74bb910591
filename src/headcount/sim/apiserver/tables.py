"""Server-side printing: the ``Table`` kubectl asks for in its Accept header instead of objects.

kubectl never formats objects itself: it asks for ``as=Table`` and prints the
rows, so `kubectl get` against the emulator works only if this answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web

from headcount.sim.apiserver.objects import JsonObject
from headcount.sim.apiserver.resources import Resource

__all__ = ["TableFormat", "table_format"]


@dataclass(frozen=True)
class TableFormat:
    """kubectl's ask for server-side printing: which Table version, how much of each object."""

    api_version: str
    include_object: str

    def table(self, resource: Resource, objects: Iterable[JsonObject], version: int) -> JsonObject:
        return {
            "kind": "Table",
            "apiVersion": self.api_version,
            "metadata": {"resourceVersion": str(version)},
            "columnDefinitions": list(resource.columns),
            "rows": [self._row(resource, obj) for obj in objects],
        }

    def _row(self, resource: Resource, obj: JsonObject) -> JsonObject:
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


def table_format(request: web.Request) -> TableFormat | None:
    """The Table version the Accept header prefers over plain JSON, if any."""
    for media_range in request.headers.get("Accept", "").split(","):
        media_type, *params = (part.strip() for part in media_range.split(";"))
        options = {key: value for key, _, value in (p.partition("=") for p in params)}
        if options.get("as") == "Table" and options.get("g") == "meta.k8s.io":
            if options.get("v") in ("v1", "v1beta1"):
                include = request.query.get("includeObject", "Metadata")
                return TableFormat(f"meta.k8s.io/{options['v']}", include)
        elif "as" not in options and media_type in ("application/json", "*/*", "application/*"):
            return None
    return None
