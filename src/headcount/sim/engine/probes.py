"""`/health` and `/metrics`, what a router polls: both answer in every mode but `hang` and `refuse`.

In `http-500` the engine still reports healthy and serves metrics, like an
engine whose model is broken; only a hung engine stops answering them.
"""

from __future__ import annotations

from aiohttp import web

from headcount.sim.engine.metrics import PROMETHEUS_HEADERS, render_metrics
from headcount.sim.engine.state import EngineState

__all__ = ["Probes"]


class Probes:
    """The handlers of `/health` and `/metrics`, over one engine's state."""

    def __init__(self, state: EngineState) -> None:
        self._state = state

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/metrics", self._metrics), web.get("/health", self._health)]

    async def _health(self, request: web.Request) -> web.Response:
        await self._state.failures.wait_while_hung()
        return web.Response()

    async def _metrics(self, request: web.Request) -> web.Response:
        state = self._state
        await state.failures.wait_while_hung()
        text = render_metrics(state)
        return web.Response(body=text.encode(), headers=PROMETHEUS_HEADERS)
