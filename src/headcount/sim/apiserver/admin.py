"""The emulator's control API under ``/_sim/``: its faults and objects, driven over HTTP.

For a process that does not share the emulator's event loop (a benchmark, a
shell): the Python API's faults and writes, with JSON bodies.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from headcount.sim.apiserver import writes
from headcount.sim.apiserver.faults import Faults
from headcount.sim.apiserver.resources import BY_PLURAL
from headcount.sim.apiserver.status import NO_SUCH_RESOURCE, StatusError, bad_request
from headcount.sim.apiserver.store import Store
from headcount.sim.apiserver.wire import json_body, json_response, parse_bool

__all__ = ["SimAdmin"]


class SimAdmin:
    """The handlers under ``/_sim/``, over one store and its faults."""

    def __init__(self, store: Store, faults: Faults) -> None:
        self._store = store
        self._faults = faults

    def routes(self) -> list[web.RouteDef]:
        return [
            web.route("GET", "/_sim/state", self._state),
            web.route("POST", "/_sim/faults/{fault}", self._fault),
            web.route("PUT", "/_sim/objects", self._apply),
            web.route("*", "/_sim/objects/{plural}/{namespace}/{name}", self._object),
        ]

    async def _state(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "resourceVersion": str(self._store.resource_version),
                "oldestResourceVersion": str(self._store.oldest),
                "openWatches": len(self._store.watches),
                "stalled": self._faults.stalled,
                "blackholed": self._faults.blackholed,
                "refusing": self._faults.refusing,
            }
        )

    async def _fault(self, request: web.Request) -> web.StreamResponse:
        fault = request.match_info["fault"]
        options = await json_body(request) if request.can_read_body else {}
        if not isinstance(options, dict):
            raise bad_request("the body must be a JSON object")
        faults = self._faults
        if fault == "drop-watches":
            await faults.drop_watches(reset=options.get("reset") is True)
        elif fault == "refuse":
            return await self._refuse(request, options.get("seconds"))
        elif fault == "blackhole":
            await faults.blackhole()
        elif fault == "stall":
            faults.stall()
        elif fault == "compact":
            faults.compact()
        elif fault == "restore":
            await faults.restore()
        else:
            raise StatusError(404, "NotFound", f"no such fault: {fault!r}")
        return await self._state(request)

    async def _refuse(self, request: web.Request, seconds: Any) -> web.StreamResponse:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            seconds = 0  # refused below, like a NaN or a negative number
        if not 0 < seconds <= 3600:
            raise bad_request(
                'refuse needs {"seconds": N}, 0 < N <= 3600: nothing could restore it over HTTP'
            )
        response = json_response({"refusingForSeconds": seconds})
        await response.prepare(request)
        await response.write_eof()  # answered before the connection goes with the rest
        self._faults.refuse_for(seconds)
        return response

    async def _apply(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if not isinstance(body, dict):
            raise bad_request("the body must be an object with a kind")
        return json_response(writes.apply(self._store, body))

    async def _object(self, request: web.Request) -> web.Response:
        info = request.match_info
        resource = BY_PLURAL.get(info["plural"])
        if resource is None:
            raise NO_SUCH_RESOURCE
        namespace, name = info["namespace"], info["name"]
        if request.method == "PATCH":
            patch = await json_body(request)
            if not isinstance(patch, dict):
                raise bad_request("a merge patch must be a JSON object")
            return json_response(writes.patch(self._store, resource, namespace, name, patch))
        if request.method == "DELETE":
            graceful = parse_bool("graceful", request.query.get("graceful"))
            self._store.delete(resource, namespace, name, graceful=graceful)
            return await self._state(request)
        raise web.HTTPMethodNotAllowed(request.method, ["PATCH", "DELETE"])
