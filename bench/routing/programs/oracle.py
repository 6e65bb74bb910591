"""The routing benchmark's reference limit: a router that knows each engine's true cache and queue.

For every request it asks every engine's `POST /sim/kv-cache/predict` (the
simulator's own prediction of this request's time to first token there: its
cached prefix, its prefill backlog and its slot wait), all at once, and
forwards the request to the engine with the lowest prediction, streaming the
answer back unchanged. No real router can know this much; it is the limit
the others are measured against. It runs as its own process so its CPU is
counted like a router's.

Run: `python -m bench.routing.programs.oracle --port P --engines http://127.0.0.1:A,...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Sequence

import aiohttp
from aiohttp import web

__all__ = ["main"]

_PATHS = ("/v1/chat/completions", "/v1/completions")
_ROUTED = web.AppKey("routed", list)


async def _predicted_ttft(session: aiohttp.ClientSession, engine: str, body: bytes) -> float:
    try:
        async with session.post(f"{engine}/sim/kv-cache/predict", data=body) as answer:
            if answer.status != 200:
                return float("inf")
            return float(json.loads(await answer.read())["ttft_s"])
    except (aiohttp.ClientError, ValueError, KeyError, TypeError):
        return float("inf")


def _app(engines: Sequence[str]) -> web.Application:
    app = web.Application()
    app[_ROUTED] = [0] * len(engines)
    sessions: list[aiohttp.ClientSession] = []

    async def session_context(app: web.Application):  # type: ignore[no-untyped-def]
        connector = aiohttp.TCPConnector(limit=0)
        sessions.append(aiohttp.ClientSession(connector=connector, timeout=None))
        yield
        await sessions[0].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        session = sessions[0]
        body = await request.read()
        predictions = await asyncio.gather(
            *(_predicted_ttft(session, engine, body) for engine in engines)
        )
        best = min(range(len(engines)), key=predictions.__getitem__)
        app[_ROUTED][best] += 1
        headers = {"Content-Type": "application/json"}
        async with session.post(f"{engines[best]}{request.path}", data=body, headers=headers) as up:
            response = web.StreamResponse(status=up.status)
            response.content_type = up.content_type
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def routed(request: web.Request) -> web.Response:
        return web.json_response({"routed": app[_ROUTED]})

    app.cleanup_ctx.append(session_context)
    for path in _PATHS:
        app.router.add_post(path, forward)
    app.router.add_get("/oracle/routed", routed)
    return app


async def _serve(port: int, engines: Sequence[str]) -> None:
    runner = web.AppRunner(_app(engines), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engines", required=True, help="comma list of engine base URLs")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, args.engines.split(",")))


if __name__ == "__main__":
    main()
