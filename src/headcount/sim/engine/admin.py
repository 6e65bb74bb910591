"""The engine's control API under `/sim/`: fail mode, adapters and stats, over HTTP.

For a process that does not share the engine's event loop, such as a
benchmark reading `/sim/stats`. It ignores every failure mode but `refuse`,
which can only be undone in-process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from headcount.sim.engine.config import FAIL_MODES, MID_STREAM_MODES, FailMode
from headcount.sim.engine.failures import check
from headcount.sim.engine.parsing import parse_object
from headcount.sim.engine.state import EngineState
from headcount.sim.engine.wire import JSON, RequestError, bad_request, json_bytes

__all__ = ["FailModeSwitch", "SimAdmin"]

FailModeSwitch = Callable[[FailMode, int | None, web.RequestHandler | None], Awaitable[None]]
"""Switch the engine's fail mode, with the mid-stream modes' chunk count (None: the
config's); `refuse` drops every connection but the one given."""


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
        """`{"mode": ...}`, and for a mid-stream mode optionally `"after_chunks": N`; the
        answer says the mode and, for those, the chunk count in force."""
        try:
            body = parse_object(await request.read())
            mode = _parse_fail_mode(body.get("mode"))
            after_chunks = body.get("after_chunks")
            check(mode, after_chunks)
        except RequestError as error:
            return error.response()
        except ValueError as error:
            return bad_request(str(error)).response()
        if mode == "refuse":
            response = web.Response(body=json_bytes({"mode": mode}), content_type=JSON)
            # This connection must live long enough to carry the answer, then close.
            await self._switch_fail_mode(mode, after_chunks, request.protocol)
            response.force_close()
            return response
        await self._switch_fail_mode(mode, after_chunks, None)
        answer: dict[str, object] = {"mode": mode}
        if mode in MID_STREAM_MODES:
            answer["after_chunks"] = self._state.failures.after_chunks
        return web.Response(body=json_bytes(answer), content_type=JSON)

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
