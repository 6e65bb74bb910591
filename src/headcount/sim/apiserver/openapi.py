"""The OpenAPI v2 document, so ``kubectl apply`` validates against the emulator as it does in a
cluster, without ``--validate=false``.

kubectl (1.20, Debian's) fetches ``/openapi/v2`` before creating anything and
gives up on a 404. The document is minimal but real: one definition per kind
the emulator serves, tagged with ``x-kubernetes-group-version-kind`` as the real
server tags them, with the top-level fields and object metadata typed (so a
misspelled ``sepc`` or a numeric label value is refused by kubectl itself, as
in a cluster); ``spec`` and ``status`` take any object. kubectl asks for
protobuf (gnostic's ``openapi.v2.Document``); other clients get JSON.
"""

from __future__ import annotations

from aiohttp import web

from headcount.sim.apiserver.discovery import GIT_VERSION
from headcount.sim.apiserver.objects import JsonObject
from headcount.sim.apiserver.openapi_proto import encode_document
from headcount.sim.apiserver.resources import RESOURCES, Resource
from headcount.sim.apiserver.wire import json_response

__all__ = ["PROTOBUF", "OpenApi", "definition_name", "openapi_document"]

PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_STRING: JsonObject = {"type": "string"}
_ANY_OBJECT: JsonObject = {"type": "object"}
_STRING_MAP: JsonObject = {"type": "object", "additionalProperties": _STRING}
_LIST_OF_OBJECTS: JsonObject = {"type": "array", "items": _ANY_OBJECT}
_METADATA_FIELDS: JsonObject = {
    "annotations": _STRING_MAP,
    "creationTimestamp": _STRING,
    "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
    "deletionTimestamp": _STRING,
    "finalizers": {"type": "array", "items": _STRING},
    "generateName": _STRING,
    "generation": {"type": "integer", "format": "int64"},
    "labels": _STRING_MAP,
    "managedFields": _LIST_OF_OBJECTS,
    "name": _STRING,
    "namespace": _STRING,
    "ownerReferences": _LIST_OF_OBJECTS,
    "resourceVersion": _STRING,
    "selfLink": _STRING,
    "uid": _STRING,
}
_BODY_FIELDS: dict[str, JsonObject] = {
    "Pod": {"spec": _ANY_OBJECT, "status": _ANY_OBJECT},
    "Service": {"spec": _ANY_OBJECT, "status": _ANY_OBJECT},
    "EndpointSlice": {
        "addressType": _STRING,
        "endpoints": _LIST_OF_OBJECTS,
        "ports": _LIST_OF_OBJECTS,
    },
    "InferencePool": {"spec": _ANY_OBJECT, "status": _ANY_OBJECT},
}


def definition_name(resource: Resource) -> str:
    """The definition's name as the real server spells it, e.g. ``io.k8s.api.core.v1.Pod``,
    and for a custom resource its group reversed (``io.k8s.networking.inference.v1...``)."""
    if resource.custom:
        reversed_group = ".".join(reversed(resource.group.split(".")))
        return f"{reversed_group}.{resource.version}.{resource.kind}"
    group = resource.group.removesuffix(".k8s.io") or "core"
    return f"io.k8s.api.{group}.{resource.version}.{resource.kind}"


def _definition(resource: Resource) -> JsonObject:
    return {
        "type": "object",
        "properties": {
            "apiVersion": _STRING,
            "kind": _STRING,
            "metadata": {"$ref": f"#/definitions/{_OBJECT_META}"},
            **_BODY_FIELDS[resource.kind],
        },
        "x-kubernetes-group-version-kind": [
            {"group": resource.group, "kind": resource.kind, "version": resource.version}
        ],
    }


def openapi_document() -> JsonObject:
    """The Swagger 2.0 document: no paths, a definition per served kind and ObjectMeta."""
    definitions = {definition_name(r): _definition(r) for r in RESOURCES}
    definitions[_OBJECT_META] = {"type": "object", "properties": _METADATA_FIELDS}
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": {},
        "definitions": definitions,
    }


class OpenApi:
    """The handler of ``/openapi/v2``: protobuf when asked for, JSON otherwise."""

    def __init__(self) -> None:
        document = openapi_document()
        self._json = document
        self._protobuf = encode_document(document)

    def routes(self) -> list[web.RouteDef]:
        return [web.route("GET", "/openapi/v2", self._v2)]

    async def _v2(self, request: web.Request) -> web.Response:
        if PROTOBUF in request.headers.get("Accept", ""):
            # the real server's type too: Go's mime parser refuses the "@" of PROTOBUF
            return web.Response(body=self._protobuf, content_type="application/octet-stream")
        return json_response(self._json)
