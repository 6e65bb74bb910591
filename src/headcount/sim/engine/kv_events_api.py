"""The KV-event publisher over HTTP: vLLM's `/kv_event_sources`, and `/sim/kv-events` for faults.

- `GET /kv_event_sources` (current layout only; vLLM 0.10 had no such
  endpoint): where to subscribe, as vLLM 0.33 answers it,
  `{"0": {<KVEventsConfig fields>}}` keyed by data-parallel rank.
- `GET /sim/kv-events`: the stream's position, buffer and faults.
- `POST /sim/kv-events` with a JSON object of any of these, applied in this
  order, answered with the new status:
  `{"restart": true}` (sequence from 0, cache emptied, no AllBlocksCleared),
  `{"drop": N}` (the next N batches are numbered and kept for replay, not sent),
  `{"silent": true|false}` (send nothing while true),
  `{"replay": true|false}` (answer replay requests or leave them unanswered),
  `{"replay_buffer": N}` (keep only the newest N batches for replay).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from headcount.sim.engine.failures import FailureGate
from headcount.sim.engine.kv_publisher import HWM, KvEventPublisher
from headcount.sim.engine.parsing import parse_object
from headcount.sim.engine.wire import JSON, RequestError, bad_request, json_bytes

__all__ = ["KvEventsApi"]

_MAX_QUEUE_SIZE = 100_000
"""vLLM's default `max_queue_size`, reported as a vLLM engine reports it."""
_FAULTS = ("restart", "drop", "silent", "replay", "replay_buffer")


class KvEventsApi:
    """The handlers of `/kv_event_sources` and `/sim/kv-events`, over one publisher."""

    def __init__(self, publisher: KvEventPublisher, failures: FailureGate) -> None:
        self._publisher = publisher
        self._failures = failures

    def routes(self) -> list[web.RouteDef]:
        routes = [
            web.get("/sim/kv-events", self._status),
            web.post("/sim/kv-events", self._set_faults),
        ]
        if self._publisher.config.layout == "current":
            routes.append(web.get("/kv_event_sources", self._sources))
        return routes

    async def _sources(self, request: web.Request) -> web.Response:
        await self._failures.wait_while_hung()
        publisher = self._publisher
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": publisher.endpoint,
            "replay_endpoint": publisher.replay_endpoint,
            "buffer_steps": publisher.config.buffer_steps,
            "hwm": HWM,
            "max_queue_size": _MAX_QUEUE_SIZE,
            "topic": publisher.config.topic,
        }
        return web.Response(body=json_bytes({"0": config}), content_type=JSON)

    async def _status(self, request: web.Request) -> web.Response:
        return web.Response(body=json_bytes(self._publisher.status()), content_type=JSON)

    async def _set_faults(self, request: web.Request) -> web.Response:
        try:
            body = parse_object(await request.read())
            _check(body)
        except RequestError as error:
            return error.response()
        publisher = self._publisher
        if body.get("restart"):
            publisher.restart()
        if "drop" in body:
            publisher.faults.drop = body["drop"]
        if "silent" in body:
            publisher.faults.silent = body["silent"]
        if "replay" in body:
            publisher.faults.replay = body["replay"]
        if "replay_buffer" in body:
            publisher.resize_replay_buffer(body["replay_buffer"])
        return await self._status(request)


def _check(body: dict[str, Any]) -> None:
    """Refuse the whole request, applying nothing, if any part of it is wrong."""
    unknown = sorted(set(body) - set(_FAULTS))
    if unknown:
        raise bad_request(f"unknown fields {unknown}; known: {', '.join(_FAULTS)}")
    for flag in ("restart", "silent", "replay"):
        if flag in body and not isinstance(body[flag], bool):
            raise bad_request(f"`{flag}` must be true or false")
    for count in ("drop", "replay_buffer"):
        value = body.get(count, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad_request(f"`{count}` must be an integer >= 0")
