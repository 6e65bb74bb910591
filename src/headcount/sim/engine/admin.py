"""The engine's control API under `/sim/`: fail mode, adapters and stats, over HTTP.

For a process that does not share the engine's event loop, such as a
benchmark reading `/sim/stats`. It ignores every failure mode but `refuse`,
which can only be undone in-process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from headcount.sim.engine.config import FAIL_MODES, FailMode
from headcount.sim.engine.parsing import parse_object
from headcount.sim.engine.state import EngineState
from headcount.sim.engine.wire import JSON, RequestError, bad_request, json_bytes

__all__ = ["FailModeSwitch", "SimAdmin"]

FailModeSwitch = Callable[[FailMode, web.RequestHandler | None], Awaitable[None]]
"""Switch the engine's fail mode; `refuse` drops every connection but the one given."""


class SimAdmin:
    """The handlers under `/sim/`, over one engine's state and its fail-mode switch."""

    def __init__(self, state: EngineState, switch_fail_mode: FailModeSwitch) -> None:
        self._state = state
        self._switch_fail_mode = switch_fail_mode

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/sim/fail-mode", self._fail_mode),
            web.post("/sim/adapters", self._adapters),
            web.get("/sim/stats", self._stats),
        ]

    async def _fail_mode(self, request: web.Request) -> web.Response:
        try:
            mode = _parse_fail_mode(parse_object(await request.read()).get("mode"))
        except RequestError as error:
            return error.response()
        response = web.Response(body=json_bytes({"mode": mode}), content_type=JSON)
        if mode == "refuse":
            # This connection must live long enough to carry the answer, then close.
            await self._switch_fail_mode(mode, request.protocol)
            response.force_close()
        else:
            await self._switch_fail_mode(mode, None)
        return response

    async def _adapters(self, request: web.Request) -> web.Response:
        try:
            adapters = parse_object(await request.read()).get("adapters")
        except RequestError as error:
            return error.response()
        if not isinstance(adapters, list) or not all(isinstance(a, str) for a in adapters):
            return bad_request("`adapters` must be a list of strings").response()
        self._state.models.set_adapters(adapters)
        return web.Response(body=json_bytes({"adapters": adapters}), content_type=JSON)

    async def _stats(self, request: web.Request) -> web.Response:
        return web.Response(body=json_bytes(self._state.stats()), content_type=JSON)


def _parse_fail_mode(value: object) -> FailMode:
    if value not in FAIL_MODES:
        raise bad_request(f"`mode` must be one of {', '.join(FAIL_MODES)}")
    return value
