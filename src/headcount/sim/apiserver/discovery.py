"""Discovery documents and the version: what clients and kubectl read before touching a resource.

kubectl resolves ``pods``, ``po`` or ``endpointslices`` to a path through
these documents, so they list exactly the resources the emulator serves.
"""

from __future__ import annotations

from aiohttp import web

from headcount.sim.apiserver.listener import Listener
from headcount.sim.apiserver.objects import JsonObject
from headcount.sim.apiserver.resources import GROUPS, RESOURCES
from headcount.sim.apiserver.status import NO_SUCH_RESOURCE
from headcount.sim.apiserver.wire import json_response

__all__ = ["GIT_VERSION", "Discovery"]

GIT_VERSION = "v1.30.0"


class Discovery:
    """The handlers of ``/version``, ``/api``, ``/apis`` and the health endpoints."""

    def __init__(self, listener: Listener) -> None:
        self._listener = listener

    def routes(self) -> list[web.RouteDef]:
        return [
            web.route("GET", "/version", self._version),
            web.route("GET", "/api", self._api_versions),
            web.route("GET", "/api/v1", self._core_resources),
            web.route("GET", "/apis", self._api_groups),
            web.route("GET", "/apis/{group}", self._api_group),
            web.route("GET", "/apis/{group}/{version}", self._group_resources),
            *(web.route("GET", path, self._ok) for path in ("/healthz", "/livez", "/readyz")),
        ]

    async def _version(self, request: web.Request) -> web.Response:
        major, minor, _ = GIT_VERSION.lstrip("v").split(".")
        return json_response(
            {
                "major": major,
                "minor": minor,
                "gitVersion": GIT_VERSION,
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2024-04-17T17:27:03Z",
                "goVersion": "go1.22.2",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

    async def _api_versions(self, request: web.Request) -> web.Response:
        listener = self._listener
        address = {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{listener.host}:{listener.port}"}
        return json_response(
            {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [address]}
        )

    async def _core_resources(self, request: web.Request) -> web.Response:
        resources = [r.discovery_entry() for r in RESOURCES if not r.group]
        return json_response(
            {"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}
        )

    async def _api_groups(self, request: web.Request) -> web.Response:
        groups = [_group_document(group) for group in GROUPS]
        return json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def _api_group(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        if group not in GROUPS:
            raise NO_SUCH_RESOURCE
        return json_response({"kind": "APIGroup", "apiVersion": "v1", **_group_document(group)})

    async def _group_resources(self, request: web.Request) -> web.Response:
        group, version = request.match_info["group"], request.match_info["version"]
        resources = [r for r in RESOURCES if r.group == group and r.version == version]
        if not resources:
            raise NO_SUCH_RESOURCE
        return json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}",
                "resources": [r.discovery_entry() for r in resources],
            }
        )

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


def _group_document(group: str) -> JsonObject:
    versions = [
        {"groupVersion": r.api_version, "version": r.version} for r in RESOURCES if r.group == group
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}
