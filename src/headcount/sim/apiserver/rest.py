"""The resource API the official clients and kubectl speak, on the real server's paths.

LIST, GET, create (POST), replace (PUT), merge patch (PATCH) and delete on
``/api/v1/...`` and ``/apis/discovery.k8s.io/v1/...``, namespaced and
cluster-wide; a LIST with ``watch=true`` becomes a watch stream.
"""

from __future__ import annotations

from aiohttp import web

from headcount.sim.apiserver import writes
from headcount.sim.apiserver.objects import JsonObject, labels_of
from headcount.sim.apiserver.resources import BY_PATH, Resource
from headcount.sim.apiserver.selectors import parse_field_selector, parse_label_selector
from headcount.sim.apiserver.status import NO_SUCH_RESOURCE, StatusError, bad_request, not_found
from headcount.sim.apiserver.store import Store
from headcount.sim.apiserver.tables import table_format
from headcount.sim.apiserver.validation import validated
from headcount.sim.apiserver.watching import WatchStreams
from headcount.sim.apiserver.wire import json_body, json_response, parse_bool, parse_version

__all__ = ["ResourceApi"]


class ResourceApi:
    """The handlers of every resource path, over one store."""

    def __init__(self, store: Store, watches: WatchStreams) -> None:
        self._store = store
        self._watches = watches

    def routes(self) -> list[web.RouteDef]:
        routes = []
        for root in ("/api/{version}", "/apis/{group}/{version}"):
            routes += [
                web.route("*", root + "/{plural}", self._collection),
                web.route("*", root + "/namespaces/{namespace}/{plural}", self._collection),
                web.route("*", root + "/namespaces/{namespace}/{plural}/{name}", self._item),
            ]
        return routes

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        resource = _resource(request)
        namespace = request.match_info.get("namespace")
        if request.method == "GET":
            if parse_bool("watch", request.query.get("watch")):
                return await self._watches.serve(request, resource, namespace)
            return self._list(request, resource, namespace)
        if request.method == "POST" and namespace is not None:
            body = await json_body(request)
            body = validated(resource, body, generate_name=True, namespace=namespace)
            created = self._store.write(resource, body, "create")
            return json_response(resource.typed(created), 201)
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])

    async def _item(self, request: web.Request) -> web.StreamResponse:
        resource = _resource(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if request.method == "GET":
            obj = self._store.get(resource, namespace, name)
            if obj is None:
                raise not_found(resource, name)
            table = table_format(request)
            if table is not None:
                version = int(obj["metadata"]["resourceVersion"])
                return json_response(table.table(resource, [obj], version))
            return json_response(resource.typed(obj))
        if request.method == "PUT":
            body = await json_body(request)
            body = validated(resource, body, generate_name=False, namespace=namespace)
            if body["metadata"]["name"] != name:
                raise bad_request(
                    f"the name of the object ({body['metadata']['name']}) does not match the "
                    f"name on the URL ({name})"
                )
            return json_response(resource.typed(self._store.write(resource, body, "replace")))
        if request.method == "PATCH":
            return json_response(await self._patch(request, resource, namespace, name))
        if request.method == "DELETE":
            return json_response(
                resource.typed(self._store.delete(resource, namespace, name, graceful=False))
            )
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "PUT", "PATCH", "DELETE"])

    async def _patch(
        self, request: web.Request, resource: Resource, namespace: str, name: str
    ) -> JsonObject:
        if request.content_type not in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            message = f"the body of the request was in an unknown format: {request.content_type}"
            raise StatusError(415, "UnsupportedMediaType", message)
        patch = await json_body(request)
        if not isinstance(patch, dict):
            raise bad_request("a merge patch must be a JSON object")
        return writes.patch(self._store, resource, namespace, name, patch)

    def _list(
        self, request: web.Request, resource: Resource, namespace: str | None
    ) -> web.Response:
        labels = parse_label_selector(request.query.get("labelSelector", ""))
        fields = parse_field_selector(request.query.get("fieldSelector", ""), resource)
        version = parse_version(request.query.get("resourceVersion"))
        match = request.query.get("resourceVersionMatch")
        if match not in (None, "", "NotOlderThan", "Exact"):
            raise bad_request(f"resourceVersionMatch: Unsupported value: {match!r}")
        if match == "Exact" and version is not None:
            objects = self._store.list_at(resource, namespace, version)
        else:
            objects, version = self._store.select(resource, namespace), None
        version = version or self._store.resource_version
        selected = [
            obj
            for obj in objects
            if all(r.matches(labels_of(obj)) for r in labels)
            and all(f.matches(obj) for f in fields)
        ]
        table = table_format(request)
        if table is not None:
            return json_response(table.table(resource, selected, version))
        return json_response(
            {
                "kind": f"{resource.kind}List",
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(version)},
                "items": selected,
            }
        )


def _resource(request: web.Request) -> Resource:
    info = request.match_info
    resource = BY_PATH.get((info.get("group", ""), info["version"], info["plural"]))
    if resource is None:
        raise NO_SUCH_RESOURCE
    return resource
