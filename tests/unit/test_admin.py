"""The router's own endpoints, answered in-process by `AdminApp` on a fake clock.

No server, no process: each test builds a `Fleet`, `Metrics` and a
`SourceStatus`, hands `AdminApp.handle` a `LocalRequest` and reads the
`LocalResponse`. Freshness is judged on the injected clock, so staleness and a
wedged discovery loop are reached by advancing it, not by waiting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headcount._http.local import LocalRequest, LocalResponse
from headcount.config import HealthSettings, ProbeSettings
from headcount.discovery.source import SourceStatus
from headcount.fleet import EngineSpec, Fleet, ProbeResult
from headcount.kvindex.stream import ClearReason
from headcount.kvindex.trust import IndexTrust
from headcount.surfaces.admin import AdminApp
from headcount.surfaces.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from headcount.surfaces.metrics import Metrics
from tests.support import KV_METRIC_LABELS, FakeClock, spec
from tests.support.kv_view_double import FakeIndexView

__all__: list[str] = []

STALE_AFTER = 10.0
DEAD_AFTER = 30.0
SOURCE = "k8s-pods"
TEXT = "text/plain; charset=utf-8"


def card(model: str, parent: str | None = None, **extra: str) -> dict[str, Any]:
    return {"id": model, "root": model, "parent": parent, **extra}


class Admin:
    """An `AdminApp` on a fake clock over one k8s source, and what it reads: fleet and flags."""

    def __init__(
        self, *, ready_requires_fresh: bool = False, kv: dict[str, FakeIndexView] | None = None
    ) -> None:
        """`kv`: the engines' index views by engine id (kv-aware routing); None: not kv-aware."""
        self.clock = FakeClock()
        self.kv = kv
        kv_views = None if kv is None else lambda: dict(kv)
        self.fleet = Fleet(unhealthy_after=ProbeSettings().unhealthy_after)
        self.source = SourceStatus(name=SOURCE, kind="k8s-pods")
        self.dead: set[str] = set()
        self.shutting_down = False
        settings = HealthSettings(
            discovery_stale_after=STALE_AFTER,
            discovery_dead_after=DEAD_AFTER,
            ready_requires_fresh=ready_requires_fresh,
        )
        self.app = AdminApp(
            self.fleet,
            Metrics(lambda: self.fleet.snapshot, [self.source], kv_views=kv_views),
            [self.source],
            settings,
            dead_sources=lambda: self.dead,
            shutting_down=lambda: self.shutting_down,
            clock=self.clock,
            kv_views=kv_views,
        )

    def synced(self) -> Admin:
        """The source's first LIST applied now."""
        self.source.synced = True
        self.source.last_list_success = self.clock.now
        self.source.last_attempt_finished = self.clock.now
        return self

    def discover(self, name: str, **spec_fields: Any) -> EngineSpec:
        """A pod `llm/{name}` discovered by the source, not probed yet."""
        url = f"http://{name}.engines.test:8000"
        engine = spec(f"llm/{name}", id=f"uid-{name}", url=url, source=SOURCE, **spec_fields)
        self.fleet.upsert(engine)
        return engine

    def engine(
        self, name: str, *cards: Mapping[str, Any], ok: bool = True, **spec_fields: Any
    ) -> None:
        """An engine discovered and probed once: `ok` with `cards`, or failed."""
        engine = self.discover(name, **spec_fields)
        result = ProbeResult(ok=True, cards=cards) if ok else ProbeResult(ok=False, error="refused")
        self.fleet.apply_probe(engine.id, result)

    async def get(self, path: str, query: str = "", method: str = "GET") -> LocalResponse:
        return await self.app.handle(LocalRequest(method, path, query, {}, b""))

    async def get_json(self, path: str) -> tuple[int, Any]:
        response = await self.get(path)
        assert response.content_type == "application/json"
        return response.status, json.loads(response.body)

    async def get_text_metrics(self) -> tuple[int, str]:
        response = await self.get("/metrics")
        assert response.content_type == METRICS_CONTENT_TYPE
        return response.status, response.body.decode()

    async def get_text(self, path: str, query: str = "") -> tuple[int, str]:
        response = await self.get(path, query)
        assert response.content_type == TEXT
        return response.status, response.body.decode()


@pytest.fixture
def admin() -> Admin:
    """Synced, with one routable engine serving `model-a`."""
    admin = Admin().synced()
    admin.engine("a", card("model-a"))
    return admin


# ------------------------------------------------------------------ /v1/models


async def test_models_lists_what_routable_engines_serve_adapters_included_each_once() -> None:
    admin = Admin().synced()
    admin.engine("a", card("model-a", owned_by="vllm"), card("sql-lora", parent="model-a"))
    admin.engine("b", card("model-a", owned_by="vllm"))
    admin.engine("sleepy", card("model-asleep"), sleeping=True)
    admin.engine("broken", card("model-broken"), ok=False)
    admin.discover("unprobed")

    status, body = await admin.get_json("/v1/models")

    assert status == 200
    assert body["object"] == "list"
    assert [entry["id"] for entry in body["data"]] == ["model-a", "sql-lora"]
    base, adapter = body["data"]
    assert (base["object"], base["owned_by"], base["parent"]) == ("model", "vllm", None)
    assert (adapter["object"], adapter["owned_by"], adapter["parent"]) == (
        "model",
        "headcount",
        "model-a",
    )


async def test_models_is_an_empty_list_when_no_engine_is_routable() -> None:
    admin = Admin().synced()
    admin.engine("broken", card("model-broken"), ok=False)

    assert await admin.get_json("/v1/models") == (200, {"object": "list", "data": []})


async def test_one_model_is_retrieved_by_its_id_slashes_and_all() -> None:
    admin = Admin().synced()
    admin.engine("a", card("org/model-a", owned_by="vllm"), card("sql-lora", parent="org/model-a"))
    admin.engine("sleepy", card("model-asleep"), sleeping=True)

    for path in ("/v1/models/org/model-a", "/v1/models/org%2Fmodel-a"):
        status, body = await admin.get_json(path)
        assert (status, body["id"], body["object"], body["owned_by"]) == (
            200,
            "org/model-a",
            "model",
            "vllm",
        )
    status, body = await admin.get_json("/v1/models/sql-lora")
    assert (status, body["parent"]) == (200, "org/model-a")
    for unknown in ("/v1/models/model-asleep", "/v1/models/nothing"):
        status, body = await admin.get_json(unknown)
        assert status == 404, unknown
        assert body["error"]["code"] == "model_not_found"
        assert body["error"]["type"] == "invalid_request_error"


# ------------------------------------------------------------------ /engines


async def test_engines_describes_every_engine_with_its_state_load_and_origin() -> None:
    admin = Admin().synced()
    admin.engine(
        "a",
        card("model-a"),
        card("sql-lora", parent="model-a"),
        model_label="model-a",
        object_ref="Pod/llm/a",
        resource_version="42",
    )
    admin.engine("broken", ok=False)
    load = admin.fleet.snapshot.by_id["uid-a"].load
    load.in_flight, load.requests, load.failures = 2, 7, 1

    status, body = await admin.get_json("/engines")

    assert status == 200
    first, second = body["engines"]
    assert first == {
        "id": "uid-a",
        "name": "llm/a",
        "url": "http://a.engines.test:8000",
        "state": "ready",
        "models": ["model-a"],
        "adapters": ["sql-lora"],
        "in_flight": 2,
        "awaiting_first_byte": 0,
        "requests": 7,
        "failures": 1,
        "running": 0.0,
        "waiting": 0.0,
        "kv_cache_usage": None,
        "capacity": None,
        "source": SOURCE,
        "object": "Pod/llm/a",
        "resource_version": "42",
        "model_label": "model-a",
        "sleeping": False,
        "last_error": None,
        "outlier": {
            "ejected": False,
            "ejected_for_seconds": None,
            "ejections": 0,
            "last_ejection_reason": None,
            "consecutive_errors": 0,
        },
    }
    assert (second["name"], second["state"], second["last_error"]) == (
        "llm/broken",
        "unhealthy",
        "refused",
    )


# ------------------------------------------------------------------ /health


async def test_health_goes_ok_then_degraded_then_unavailable_as_discovery_ages(
    admin: Admin,
) -> None:
    status, body = await admin.get_json("/health")
    assert (status, body["status"], body["reasons"]) == (200, "ok", [])
    assert body["engines"]["routable"] == 1

    admin.clock.advance(STALE_AFTER - 0.5)
    assert (await admin.get_json("/health"))[1]["status"] == "ok", "not stale yet"

    admin.clock.advance(1.0)
    status, body = await admin.get_json("/health")
    assert (status, body["status"]) == (200, "degraded")
    assert body["reasons"] == [f"discovery stale: {SOURCE}"]
    assert body["sources"][0]["last_list_age_seconds"] == STALE_AFTER + 0.5

    admin.clock.advance(DEAD_AFTER - STALE_AFTER)
    status, body = await admin.get_json("/health")
    assert (status, body["status"]) == (503, "unavailable")
    assert any(f"discovery loop {SOURCE} made no progress" in r for r in body["reasons"])


async def test_health_is_unavailable_before_the_first_sync() -> None:
    admin = Admin()
    status, body = await admin.get_json("/health")
    assert (status, body["status"]) == (503, "unavailable")
    assert f"first sync not done: {SOURCE}" in body["reasons"]


async def test_a_watch_event_keeps_discovery_fresh(admin: Admin) -> None:
    admin.clock.advance(STALE_AFTER + 1)
    admin.source.last_event = admin.clock.now

    assert (await admin.get_json("/health"))[1]["status"] == "ok"


# ------------------------------------------------------------------ /livez and /readyz


async def test_livez_and_readyz_say_ok_and_list_their_checks_when_verbose(admin: Admin) -> None:
    assert await admin.get_text("/livez") == (200, "ok\n")
    assert await admin.get_text("/readyz") == (200, "ok\n")
    assert await admin.get_text("/livez", "verbose") == (
        200,
        f"[+]discovery:{SOURCE} ok\nlivez check passed\n",
    )
    assert await admin.get_text("/readyz", "verbose=1") == (
        200,
        "[+]synced ok\n[+]shutdown ok\nreadyz check passed\n",
    )


async def test_readyz_fails_before_the_first_sync_and_names_the_check() -> None:
    admin = Admin()
    assert await admin.get_text("/readyz") == (
        503,
        f"[-]synced failed: first sync not done: {SOURCE}\n[+]shutdown ok\nreadyz check failed\n",
    )
    assert await admin.get_text("/readyz/synced") == (
        503,
        f"[-]synced failed: first sync not done: {SOURCE}\nreadyz check failed\n",
    )
    assert await admin.get_text("/readyz/shutdown") == (200, "ok\n")
    assert (await admin.get_text("/livez"))[0] == 200, "not synced yet is not dead"


async def test_readyz_requiring_fresh_discovery_fails_only_that_check_when_stale() -> None:
    admin = Admin(ready_requires_fresh=True).synced()
    admin.engine("a", card("model-a"))
    assert (await admin.get_text("/readyz"))[0] == 200

    admin.clock.advance(STALE_AFTER + 1)

    assert await admin.get_text("/readyz", "verbose") == (
        503,
        "[+]synced ok\n[+]shutdown ok\n"
        f"[-]fresh failed: discovery stale: {SOURCE}\nreadyz check failed\n",
    )
    assert (await admin.get_text("/readyz/fresh"))[0] == 503
    assert (await admin.get_text("/readyz/synced"))[0] == 200
    assert (await admin.get_text("/livez"))[0] == 200


async def test_shutting_down_fails_readiness_and_keeps_liveness(admin: Admin) -> None:
    admin.shutting_down = True

    assert await admin.get_text("/readyz/shutdown") == (
        503,
        "[-]shutdown failed: shutting down\nreadyz check failed\n",
    )
    assert await admin.get_text("/livez") == (200, "ok\n")


async def test_livez_fails_for_a_stopped_or_a_wedged_discovery_loop(admin: Admin) -> None:
    admin.dead.add(SOURCE)
    assert await admin.get_text("/livez") == (
        503,
        f"[-]discovery:{SOURCE} failed: discovery loop {SOURCE} has stopped\nlivez check failed\n",
    )

    admin.dead.clear()
    admin.clock.advance(DEAD_AFTER + 1)
    status, text = await admin.get_text(f"/livez/discovery:{SOURCE}")
    assert status == 503
    assert f"made no progress for 31s (bound {DEAD_AFTER:g}s)" in text


async def test_an_unknown_check_is_not_found(admin: Admin) -> None:
    response = await admin.get("/readyz/nonexistent")
    assert response.status == 404


# ------------------------------------------------------------------ /metrics, methods, paths


async def test_metrics_are_the_prometheus_exposition(admin: Admin) -> None:
    response = await admin.get("/metrics")
    assert (response.status, response.content_type) == (200, METRICS_CONTENT_TYPE)
    assert b'headcount_engines{state="ready"} 1.0' in response.body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_writes_are_method_not_allowed(admin: Admin, method: str) -> None:
    response = await admin.get("/engines", method=method)
    assert response.status == 405
    error = json.loads(response.body)["error"]
    assert error["message"] == f"{method} not allowed on /engines; use GET, HEAD"
    assert (error["type"], error["code"]) == ("invalid_request_error", "method_not_allowed")
    assert response.headers["allow"] == "GET, HEAD"


async def test_head_is_answered_like_get(admin: Admin) -> None:
    assert (await admin.get("/livez", method="HEAD")).status == 200


async def test_an_unknown_path_is_not_found(admin: Admin) -> None:
    status, body = await admin.get_json("/v1/nothing")
    assert status == 404
    assert body["error"]["message"] == "no route for /v1/nothing"
    assert body["error"]["code"] == "not_found"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_an_unknown_path_is_not_found_whatever_the_method(admin: Admin, method: str) -> None:
    response = await admin.get("/unknown", method=method)
    assert response.status == 404
    assert json.loads(response.body)["error"]["code"] == "not_found"
    assert (await admin.get("/readyz/synced", method=method)).status == 405


# ------------------------------------------------------------------ kv-aware: cache indexes

KV_INDEX_KEYS = {
    "state",
    "reason",
    "blocks",
    "hints",
    "memory_bytes",
    "memory_limit_bytes",
    "capacity",
    "last_event_age_s",
}


def kv_admin(views: dict[str, FakeIndexView], *names: str) -> Admin:
    admin = Admin(kv=views).synced()
    for name in names:
        admin.engine(name, card("model-a"))
    return admin


async def test_engines_show_each_index_state_in_the_issue_words() -> None:
    views = {
        "uid-a": FakeIndexView(
            IndexTrust.SYNCED, "events flowing", 40, 1000, 16, 0.25, hints=7, memory_bytes=9216
        ),
        "uid-b": FakeIndexView(IndexTrust.REBUILDING, "cleared: restart", 3, 1000),
        "uid-c": FakeIndexView(IndexTrust.STALE, "no event for 12s", 900, 1000, 16, 12.0004),
        "uid-d": FakeIndexView(IndexTrust.OFF, "cannot connect to :5557"),
    }
    admin = kv_admin(views, "a", "b", "c", "d", "e")
    _, body = await admin.get_json("/engines")
    shown = {engine["name"]: engine["kv_index"] for engine in body["engines"]}
    assert all(index.keys() == KV_INDEX_KEYS for index in shown.values())
    assert shown["llm/a"] == {
        "state": "synced",
        "reason": "events flowing",
        "blocks": 40,
        "hints": 7,
        "memory_bytes": 9216,
        "memory_limit_bytes": 256 << 20,
        "capacity": 1000,
        "last_event_age_s": 0.25,
    }
    assert [shown[f"llm/{n}"]["state"] for n in "abcde"] == [
        "synced",
        "rebuilding",
        "stale",
        "off",
        "off",
    ]
    assert shown["llm/c"]["last_event_age_s"] == 12.0
    assert shown["llm/e"]["reason"] == "no index"


async def test_without_kv_aware_routing_nothing_about_indexes_appears(admin: Admin) -> None:
    _, engines = await admin.get_json("/engines")
    assert all("kv_index" not in engine for engine in engines["engines"])
    _, health = await admin.get_json("/health")
    assert "kv_index" not in health
    _, text = await admin.get_text_metrics()
    assert "headcount_kv_" not in text


async def test_health_is_degraded_never_unavailable_while_an_index_is_stale() -> None:
    views = {
        "uid-a": FakeIndexView(IndexTrust.SYNCED),
        "uid-b": FakeIndexView(IndexTrust.STALE, "no event for 12s"),
    }
    admin = kv_admin(views, "a", "b")
    status, body = await admin.get_json("/health")
    assert (status, body["status"]) == (200, "degraded")
    reason = "kv index not usable, routing by load on 1 engine(s): llm/b stale (no event for 12s)"
    assert body["kv_index"] == {"ok": False, "reason": reason}
    assert reason in body["reasons"]
    ready, _ = await admin.get_text("/readyz")
    live, _ = await admin.get_text("/livez")
    assert (ready, live) == (200, 200)


async def test_health_is_ok_when_every_routable_index_is_synced_or_rebuilding() -> None:
    views = {
        "uid-a": FakeIndexView(IndexTrust.SYNCED),
        "uid-b": FakeIndexView(IndexTrust.REBUILDING, "cleared: gap"),
        "uid-down": FakeIndexView(IndexTrust.OFF, "cannot connect"),
    }
    admin = kv_admin(views, "a", "b")
    admin.engine("down", card("model-a"), ok=False)
    _, body = await admin.get_json("/health")
    assert body["status"] == "ok"
    assert body["kv_index"] == {"ok": True, "reason": ""}


async def test_the_health_reason_stays_short_for_a_big_fleet() -> None:
    names = [f"e{n:03}" for n in range(300)]
    views = {f"uid-{n}": FakeIndexView(IndexTrust.OFF, "x" * 500) for n in names}
    admin = kv_admin(views, *names)
    _, body = await admin.get_json("/health")
    reason = body["kv_index"]["reason"]
    assert "on 300 engine(s)" in reason and reason.endswith("and 295 more")
    assert len(reason) < 1000


async def test_kv_metrics_follow_the_views_and_vanish_with_the_engine() -> None:
    views = {
        "uid-a": FakeIndexView(
            IndexTrust.STALE,
            blocks=40,
            last_event_age=3.5,
            events_applied=120,
            gaps=2,
            replays_filled=1,
            replays_failed=1,
            clears={ClearReason.GAP: 1},
            predicted_hit_tokens=640,
            reported_hit_tokens=512.0,
            hints=5,
            memory_bytes=8640,
            memory_limit_bytes=1 << 20,
            refused_blocks=3,
        ),
        "uid-b": FakeIndexView(IndexTrust.OFF),
    }
    admin = kv_admin(views, "a", "b")
    _, text = await admin.get_text_metrics()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("headcount_kv_")
    }
    names = {name for name, _ in samples}
    assert names == set(KV_METRIC_LABELS)
    for name, labels in samples:
        assert {k for k, _ in labels} == KV_METRIC_LABELS[name], name

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"engine": "llm/a", **labels}.items())))]

    assert [value("headcount_kv_index_state", state=t.value) for t in IndexTrust] == [0, 0, 1, 0]
    assert value("headcount_kv_index_blocks") == 40
    assert value("headcount_kv_index_hints") == 5
    assert value("headcount_kv_index_memory_bytes") == 8640
    assert value("headcount_kv_index_memory_limit_bytes") == 1 << 20
    assert value("headcount_kv_index_refused_blocks_total") == 3
    assert value("headcount_kv_events_applied_total") == 120
    assert value("headcount_kv_event_gaps_total") == 2
    assert value("headcount_kv_replays_total", outcome="filled") == 1
    assert value("headcount_kv_replays_total", outcome="failed") == 1
    assert value("headcount_kv_index_clears_total", reason="gap") == 1
    assert value("headcount_kv_index_clears_total", reason="restart") == 0
    assert value("headcount_kv_last_event_age_seconds") == 3.5
    assert value("headcount_kv_predicted_cached_tokens_total") == 640
    assert value("headcount_kv_engine_reported_hit_tokens_total") == 512
    b_series = {name for name, labels in samples if ("engine", "llm/b") in labels}
    assert "headcount_kv_last_event_age_seconds" not in b_series  # no event yet
    assert "headcount_kv_engine_reported_hit_tokens_total" not in b_series

    admin.fleet.remove("uid-a")
    _, text = await admin.get_text_metrics()
    assert 'engine="llm/a"' not in text and 'engine="llm/b"' in text
