"""vLLM's `--api-key`: every `/v1/` request needs `Authorization: Bearer <key>`, else 401.

As vLLM's server does, only paths under `/v1` are guarded: `/health` and
`/metrics` (what routers and Prometheus poll) stay open, and so does the
simulator's own `/sim/` admin API. Each refusal is counted (`unauthorized` in
the stats), so a test can tell that a router never showed the engine a wrong key.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from headcount.sim.engine.state import EngineState
from headcount.sim.engine.wire import JSON, json_bytes

__all__ = ["require_api_key"]

_UNAUTHORIZED = json_bytes({"error": "Unauthorized"})
"""vLLM's body for a missing or wrong key."""


def require_api_key(key: str, state: EngineState) -> Middleware:
    """An aiohttp middleware refusing `/v1` requests that do not bear `key`."""
    expected = f"Bearer {key}"

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1") and request.headers.get("Authorization") != expected:
            state.unauthorized += 1
            return web.Response(status=401, body=_UNAUTHORIZED, content_type=JSON)
        return await handler(request)

    return middleware
