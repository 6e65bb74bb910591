"""The router's own endpoints: `/v1/models`, `/engines`, `/livez`, `/readyz`, `/health`, `/metrics`.

None of them is on the hot path. Each answer is computed from one fleet
snapshot and the sources' freshness, at the time of the request: `/v1/models`
(and `/v1/models/{id}`, one of its cards) lists only what routable engines
serve, and health is never green from the router's own state alone. With
`--routing kv-aware`, `/engines` shows each engine's cache index (`kv_index`:
state, reason, blocks, capacity, last event age) and `/health` judges them;
otherwise neither says anything about it.
`/engines` also lists, under `not_engines`, the objects discovery matched that
are not engines (state `not_an_engine`, with the reason): they are not in the
fleet, so nothing probes or routes to them, but an operator sees them.

With `--admin-port` the OpenAI API's `/v1/models` stays on the data port
(`handle_api`) and the rest moves to the admin port (`handle_admin`); each port
answers 404 for the other's paths, the data port's naming the admin port.
"""

from __future__ import annotations

import functools
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from headcount._http.local import LocalRequest, LocalResponse, method_not_allowed, not_found
from headcount._http.wire import error_body
from headcount.config import HealthSettings
from headcount.discovery.source import NotAnEngine, SourceStatus
from headcount.fleet import Engine, Fleet, Snapshot
from headcount.kvindex.trust import IndexTrust
from headcount.surfaces.health import Check, HealthReport, evaluate, render_checks
from headcount.surfaces.kv_views import IndexStatus, KvViews
from headcount.surfaces.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from headcount.surfaces.metrics import Metrics

if TYPE_CHECKING:
    from headcount.routing.kv.planning import PlacementStatus

__all__ = ["AdminApp"]

_TEXT = "text/plain; charset=utf-8"
_API_PREFIX = "/v1/"
_MODEL_PREFIX = "/v1/models/"


class AdminApp:
    """Answers the control-plane GETs; `handle` is the proxy's `LocalHandler`."""

    def __init__(
        self,
        fleet: Fleet,
        metrics: Metrics,
        sources: Sequence[SourceStatus],
        settings: HealthSettings,
        *,
        dead_sources: Callable[[], Collection[str]],
        shutting_down: Callable[[], bool],
        local_problems: Callable[[], Sequence[str]] = tuple,
        clock: Callable[[], float] = time.monotonic,
        kv_views: KvViews | None = None,
        kv_placement: Callable[[], PlacementStatus] | None = None,
        admin_port: int | None = None,
    ) -> None:
        """`kv_views`: the engines' cache indexes with `--routing kv-aware`, else None;
        `kv_placement`: its placement plan's state, with `--kv-placement on`; `admin_port`:
        `--admin-port`, which the data port's 404 for an admin path names."""
        self._admin_port = admin_port
        self._fleet = fleet
        self._kv_views = kv_views
        self._kv_placement = kv_placement
        self._metrics = metrics
        self._sources = sources
        self._settings = settings
        self._dead_sources = dead_sources
        self._shutting_down = shutting_down
        self._local_problems = local_problems
        self._clock = clock
        self._started = clock()
        self._created = int(time.time())
        """`created` of the models in `/v1/models`: when this router started knowing them."""

    def report(self) -> HealthReport:
        return evaluate(
            self._sources,
            self._fleet.snapshot,
            self._settings,
            now=self._clock(),
            started=self._started,
            dead_sources=self._dead_sources(),
            shutting_down=self._shutting_down(),
            local_problems=self._local_problems(),
            kv_indexes=None if self._kv_views is None else self._kv_views(),
            kv_placement=None if self._kv_placement is None else self._kv_placement(),
        )

    async def handle(self, request: LocalRequest) -> LocalResponse:
        """An unknown path is 404 whatever the method; a known one takes GET and HEAD only."""
        method, path = request.method, request.path
        answer = self._route(path, request.query)
        if answer is None:
            return not_found(path)
        if method not in ("GET", "HEAD"):
            return method_not_allowed(method, path, "GET, HEAD")
        return await answer()

    def _route(self, path: str, query: str) -> Callable[[], Awaitable[LocalResponse]] | None:
        """What answers `path`, or None when nothing does."""
        if path == "/v1/models":
            return self._models
        if path.startswith(_MODEL_PREFIX) and len(path) > len(_MODEL_PREFIX):
            return functools.partial(self._model, urllib.parse.unquote(path[len(_MODEL_PREFIX) :]))
        if path == "/engines":
            return self._engines
        if path == "/metrics":
            return self._metrics_text
        if path == "/health":
            return self._health
        for title in ("livez", "readyz"):
            if path == f"/{title}" or path.startswith(f"/{title}/"):
                return functools.partial(self._checks, title, path, query)
        return None

    async def _engines(self) -> LocalResponse:
        snapshot, now = self._fleet.snapshot, self._fleet.now()
        engines = [_engine_json(engine, snapshot, now) for engine in snapshot.engines]
        if self._kv_views is not None:
            views = self._kv_views()
            for engine, answer in zip(snapshot.engines, engines, strict=True):
                answer["kv_index"] = _kv_index_json(views.get(engine.id))
        not_engines = [
            _not_engine_json(entry, source.name)
            for source in self._sources
            for entry in sorted(source.not_engines.values(), key=lambda e: e.name)
        ]
        return LocalResponse.json(200, {"engines": engines, "not_engines": not_engines})

    async def _metrics_text(self) -> LocalResponse:
        return LocalResponse(200, await self._metrics.render(), METRICS_CONTENT_TYPE)

    async def _health(self) -> LocalResponse:
        report = self.report()
        return LocalResponse.json(503 if report.status == "unavailable" else 200, report.body)

    async def _checks(self, title: str, path: str, query: str) -> LocalResponse:
        report = self.report()
        return _checks(title, report.live if title == "livez" else report.ready, path, query)

    async def handle_api(self, request: LocalRequest) -> LocalResponse:
        """The data port's answers when the admin endpoints have a port of their own."""
        path = request.path
        if path.startswith(_API_PREFIX):
            return await self.handle(request)
        if self._route(path, request.query) is not None:
            return not_found(path, f"the admin endpoints are on --admin-port {self._admin_port}")
        return not_found(path)

    async def handle_admin(self, request: LocalRequest) -> LocalResponse:
        """The admin port's answers: everything but the OpenAI API."""
        if request.path.startswith(_API_PREFIX):
            return not_found(request.path)
        return await self.handle(request)

    async def _models(self) -> LocalResponse:
        cards = self._cards()
        return LocalResponse.json(200, {"object": "list", "data": cards})

    async def _model(self, model: str) -> LocalResponse:
        """`GET /v1/models/{model}` (the SDK's `models.retrieve`): its card in `/v1/models`,
        else 404 in OpenAI's words."""
        for card in self._cards():
            if card.get("id") == model:
                return LocalResponse.json(200, card)
        message = f"The model `{model}` does not exist or no routable engine serves it."
        body = error_body(message, "invalid_request_error", "model_not_found")
        return LocalResponse(404, body)

    def _cards(self) -> list[dict[str, Any]]:
        """The model cards of routable engines, with OpenAI's fields filled in."""
        cards = [dict(card) for card in self._fleet.snapshot.model_cards()]
        for card in cards:
            card.setdefault("object", "model")
            card.setdefault("created", self._created)
            card.setdefault("owned_by", "headcount")
        return cards


def _checks(title: str, checks: Sequence[Check], path: str, query: str) -> LocalResponse:
    """`/livez`, `/readyz`, or one sub-check (`/readyz/synced`); `?verbose` lists each check."""
    name = path[len(title) + 2 :]
    if name:
        checks = [check for check in checks if check.name == name]
        if not checks:
            return not_found(path)
    verbose = any(part.split("=")[0] == "verbose" for part in query.split("&"))
    status, text = render_checks(title, checks, verbose=verbose)
    return LocalResponse(status, text.encode(), _TEXT)


def _engine_json(engine: Engine, snapshot: Snapshot, now: float) -> dict[str, Any]:
    spec = engine.spec
    ejection = engine.ejection
    ejected = engine.id in snapshot.ejected
    return {
        "id": spec.id,
        "name": spec.name,
        "url": spec.url,
        "state": engine.state.value,
        "models": list(engine.models),
        "adapters": list(engine.adapters),
        "in_flight": engine.load.in_flight,
        "awaiting_first_byte": engine.load.awaiting,
        "requests": engine.load.requests,
        "failures": engine.load.failures,
        "running": engine.load.running,
        "waiting": engine.load.waiting,
        "kv_cache_usage": engine.load.kv_usage,
        "capacity": engine.load.concurrency.value,
        "source": spec.source,
        "object": spec.object_ref,
        "resource_version": spec.resource_version,
        "model_label": spec.model_label,
        "sleeping": spec.sleeping,
        "last_error": engine.last_error,
        "outlier": {
            "ejected": ejected,
            "ejected_for_seconds": round(max(0.0, ejection.until - now), 3) if ejected else None,
            "ejections": ejection.count,
            "last_ejection_reason": ejection.reason,
            "consecutive_errors": engine.load.consecutive_errors,
        },
    }


def _not_engine_json(entry: NotAnEngine, source: str) -> dict[str, Any]:
    return {
        "id": entry.id,
        "name": entry.name,
        "object": entry.object_ref,
        "source": source,
        "state": "not_an_engine",
        "reason": entry.reason,
    }


def _kv_index_json(view: IndexStatus | None) -> Mapping[str, Any]:
    if view is None:
        return {
            "state": IndexTrust.OFF.value,
            "reason": "no index",
            "blocks": 0,
            "hints": 0,
            "memory_bytes": 0,
            "memory_limit_bytes": None,
            "capacity": None,
            "last_event_age_s": None,
        }
    age = view.last_event_age
    return {
        "state": view.trust.value,
        "reason": view.reason,
        "blocks": view.blocks,
        "hints": view.hints,
        "memory_bytes": view.memory_bytes,
        "memory_limit_bytes": view.memory_limit_bytes,
        "capacity": view.capacity,
        "last_event_age_s": None if age is None else round(age, 3),
    }
