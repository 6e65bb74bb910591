"""Flow control through a whole router and real simulated engines: limits, usage, the queue."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from headcount.config import FlowSettings, RoutingName
from headcount.fleet import EngineLoad
from headcount.fleet.capacity import Capacity
from headcount.sim.cluster.polling import wait_until
from headcount.sim.engine.config import EngineSimConfig
from headcount.sim.engine.server import running_engine
from tests.support.metric_families import FLOW_METRIC_LABELS
from tests.support.router import MODEL, Running, router_before

__all__: list[str] = []

TENANTS = """
[default]
priority = 0

[[tenant]]
name = "capped"
keys = ["sk-capped"]
requests_per_minute = 3

[[tenant]]
name = "metered"
keys = ["sk-metered"]
tokens_per_minute = 100000

[[tenant]]
name = "chat"
keys = ["sk-chat"]
priority = 10

[[tenant]]
name = "batch"
keys = ["sk-batch"]
"""


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


async def _sample(running: Running, name: str, **labels: str) -> float:
    """One sample of the router's `/metrics`, as a scrape reads it (0 when absent)."""
    _, text, _ = await running.get("/metrics", "sk-chat")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


@asynccontextmanager
async def _one_engine(
    tmp_path: Path, engine: EngineSimConfig | None = None, **options: Any
) -> AsyncIterator[tuple[Running, EngineLoad]]:
    """A router with `TENANTS` before one simulated engine, once it routes to it: the
    router, and the engine's load as the router keeps it."""
    async with (
        running_engine(engine or EngineSimConfig()) as sim,
        router_before([sim.url], tmp_path, client_keys=None, tenants=TENANTS, **options) as running,
    ):
        await wait_until(lambda: running.router.fleet.snapshot.routable, timeout=10)
        yield running, running.router.fleet.snapshot.routable[0].load


async def test_a_tenant_over_its_requests_per_minute_hears_429_and_when_to_retry(
    tmp_path: Path,
) -> None:
    async with _one_engine(tmp_path) as (running, _):
        remaining = []
        for _ in range(3):
            status, _, headers = await running.post(
                "/v1/chat/completions", _chat(max_tokens=2), _auth("sk-capped")
            )
            assert status == 200
            assert headers["x-ratelimit-limit-requests"] == "3"
            remaining.append(headers["x-ratelimit-remaining-requests"])
        assert remaining == ["2", "1", "0"]
        status, text, headers = await running.post(
            "/v1/chat/completions", _chat(max_tokens=2), _auth("sk-capped")
        )
        assert status == 429
        error = json.loads(text)["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert "capped" in error["message"] and "requests per minute" in error["message"]
        assert 1 <= int(headers["Retry-After"]) <= 120  # two windows at most
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert headers["x-ratelimit-reset-requests"].endswith("s")
        status, _, headers = await running.post(
            "/v1/chat/completions", _chat(max_tokens=2), _auth("sk-chat")
        )
        assert status == 200 and "x-ratelimit-limit-requests" not in headers
        assert (
            await _sample(
                running, "headcount_tenant_requests_total", tenant="capped", outcome="rate_limited"
            )
            == 1
        )
        assert (
            await _sample(
                running, "headcount_tenant_requests_total", tenant="capped", outcome="admitted"
            )
            == 3
        )
        _, text, _ = await running.get("/metrics", "sk-chat")
        families = {family.name: family for family in text_string_to_metric_families(text)}
        for name, labels in FLOW_METRIC_LABELS.items():
            family = families[name.removesuffix("_total")]
            assert all(set(s.labels) - {"le"} == labels for s in family.samples), name
        requests = families["headcount_tenant_requests"].samples
        assert {s.labels["tenant"] for s in requests} == {"capped", "chat"}


async def _stream(running: Running, key: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with running.session.post(
        running.url + "/v1/chat/completions", json=body, headers=_auth(key)
    ) as response:
        assert response.status == 200
        text = await response.text()
    events = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


async def test_streams_are_settled_on_the_engines_usage_and_clients_see_only_what_they_asked(
    tmp_path: Path,
) -> None:
    async with _one_engine(tmp_path) as (running, _):
        plain = await _stream(running, "sk-metered", _chat(max_tokens=5, stream=True))
        assert all(chunk["choices"] for chunk in plain), "a usage chunk the client never asked for"
        assert all(chunk.get("usage") is None for chunk in plain)
        completion = await _sample(
            running, "headcount_tenant_tokens_total", tenant="metered", kind="completion"
        )
        assert completion == 5
        prompt = await _sample(
            running, "headcount_tenant_tokens_total", tenant="metered", kind="prompt"
        )
        assert prompt > 0
        asked = await _stream(
            running,
            "sk-metered",
            _chat(max_tokens=4, stream=True, stream_options={"include_usage": True}),
        )
        assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == 4

        async def settled() -> bool:
            kind = {"tenant": "metered", "kind": "completion"}
            return await _sample(running, "headcount_tenant_tokens_total", **kind) == 9

        await wait_until(settled, timeout=5)


async def test_the_router_learns_an_engines_capacity_when_it_begins_to_queue(
    tmp_path: Path,
) -> None:
    slow = EngineSimConfig(max_running=1, token_delay=0.05)
    async with _one_engine(tmp_path, slow, probe_interval=0.05) as (running, load):
        assert load.concurrency.value is None
        both = [
            running.post("/v1/chat/completions", _chat(max_tokens=20), _auth("sk-batch"))
            for _ in range(2)
        ]
        learning = asyncio.gather(*both)
        await wait_until(lambda: load.concurrency.value == 1, timeout=10, interval=0.01)
        assert [status for status, _, _ in await learning] == [200, 200]
        metrics = (await running.get("/metrics", "sk-batch"))[1]
        assert "headcount_engine_capacity{" in metrics


async def test_when_every_engine_is_full_the_higher_priority_is_served_first(
    tmp_path: Path,
) -> None:
    slow = EngineSimConfig(max_running=1, token_delay=0.05)
    async with _one_engine(tmp_path, slow, probe_interval=600) as (running, load):
        load.concurrency = Capacity(
            1
        )  # as learned (above); no probe comes to change it in this test
        flow = running.router.flow
        assert flow is not None
        finished: list[str] = []

        async def one(key: str, name: str, tokens: int = 4) -> int:
            status, _, _ = await running.post(
                "/v1/chat/completions", _chat(max_tokens=tokens), _auth(key)
            )
            finished.append(name)
            return status

        first = asyncio.ensure_future(one("sk-batch", "batch-0", 10))
        await wait_until(lambda: load.in_flight == 1, timeout=5, interval=0.005)

        def queued(count: int) -> Callable[[], bool]:
            return lambda: flow.queued == count

        batch = []
        for n in (1, 2):  # one at a time: the order they reach the router is the order queued
            batch.append(asyncio.ensure_future(one("sk-batch", f"batch-{n}")))
            await wait_until(queued(n), timeout=5, interval=0.005)
        chat = asyncio.ensure_future(one("sk-chat", "chat"))
        await wait_until(lambda: flow.queued == 3, timeout=5, interval=0.005)
        assert await asyncio.gather(first, chat, *batch) == [200] * 4
        assert finished == ["batch-0", "chat", "batch-1", "batch-2"]
        assert await _sample(running, "headcount_queue_seconds_count", tenant="chat") == 1
        assert await _sample(running, "headcount_queue_seconds_sum", tenant="chat") > 0


async def test_a_queue_timeout_is_a_503_with_retry_after(tmp_path: Path) -> None:
    slow = EngineSimConfig(max_running=1, token_delay=0.2)
    timeout = FlowSettings(queue_timeout=0.2)
    async with _one_engine(tmp_path, slow, probe_interval=600, flow=timeout) as (running, load):
        load.concurrency = Capacity(1)  # as learned; no probe comes to change it in this test
        long = asyncio.ensure_future(
            running.post("/v1/chat/completions", _chat(max_tokens=10), _auth("sk-batch"))
        )
        await wait_until(lambda: load.in_flight == 1, timeout=5, interval=0.005)
        status, text, headers = await running.post(
            "/v1/chat/completions", _chat(max_tokens=1), _auth("sk-chat")
        )
        assert status == 503 and json.loads(text)["error"]["code"] == "queue_timeout"
        assert int(headers["Retry-After"]) >= 1
        assert not long.done()  # refused while the slot was still taken, not after
        assert (await long)[0] == 200


async def test_kv_aware_routing_is_metered_the_same_way(tmp_path: Path) -> None:
    async with _one_engine(tmp_path, routing=RoutingName.KV_AWARE) as (running, _):
        status, _, headers = await running.post(
            "/v1/chat/completions", _chat(max_tokens=3), _auth("sk-capped")
        )
        assert status == 200 and headers["x-ratelimit-remaining-requests"] == "2"
        streamed = await _stream(running, "sk-metered", _chat(max_tokens=2, stream=True))
        assert all(chunk["choices"] for chunk in streamed)

        async def counted() -> bool:
            kind = {"tenant": "metered", "kind": "completion"}
            return await _sample(running, "headcount_tenant_tokens_total", **kind) == 2

        await wait_until(counted, timeout=5)
