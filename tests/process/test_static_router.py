"""The router as clients use it: the official `openai` SDK and curl against a real process.

`headcount serve` runs as a child process in front of simulated engines; the
clients are the ones users run, so what they accept (SSE framing, error
bodies, model lists) is what is tested. The `/metrics` export is checked
against the families the README promises (tests/support/metric_families.py
lists them; the alert rules and dashboard are held to the same list), after
real traffic, a failover and discovery from the API server emulator, and an
engine's series must go with its pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import RouterFlags, RouterProcess, SimCluster, Timings, sim_cluster
from headcount.sim.engine import EngineSimConfig, running_engine
from tests.support import EXPORTED_METRICS, HISTOGRAMS, METRIC_LABELS, wait_until
from tests.support.metric_families import RESUME_METRIC_LABELS

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

MODEL = "sim-model"
ADAPTER = "sql-lora"
CLIENT_TIMEOUT = 10.0
CURL = shutil.which("curl") or "/usr/bin/curl"


# ------------------------------------------------------------------ static mode, real clients


@contextlib.asynccontextmanager
async def static_router() -> AsyncIterator[RouterProcess]:
    """A router in static mode before two ready simulated engines."""
    async with (
        running_engine(EngineSimConfig(model=MODEL, adapters=(ADAPTER,), name="a")) as a,
        running_engine(EngineSimConfig(model=MODEL, adapters=(ADAPTER,), name="b")) as b,
        RouterProcess(
            RouterFlags(
                discovery=DiscoveryMode.STATIC,
                backends=(a.url, b.url),
                timings=Timings(probe_interval=0.2, drain_delay=0),
            )
        ) as router,
    ):
        await wait_until(
            lambda: routable_count(router, 2), timeout=10, what="both engines routable"
        )
        yield router


async def routable_count(router: RouterProcess, wanted: int) -> bool:
    body = await router.client.health()
    return bool(body["engines"]["routable"] == wanted)


@pytest.fixture
async def client() -> AsyncIterator[tuple[openai.AsyncOpenAI, RouterProcess]]:
    async with static_router() as router:
        sdk = openai.AsyncOpenAI(
            base_url=router.url + "/v1", api_key="x", timeout=CLIENT_TIMEOUT, max_retries=0
        )
        try:
            yield sdk, router
        finally:
            await sdk.close()


async def test_openai_sdk_chat_completion(
    client: tuple[openai.AsyncOpenAI, RouterProcess],
) -> None:
    sdk, _ = client
    reply = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert reply.object == "chat.completion"
    assert reply.model == MODEL
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    assert reply.system_fingerprint in ("a", "b")


async def test_openai_sdk_streams_chat_deltas_to_the_end(
    client: tuple[openai.AsyncOpenAI, RouterProcess],
) -> None:
    sdk, _ = client
    stream = await sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas, reasons, usage = [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert len(deltas) == 7
    assert "".join(deltas).strip()
    assert reasons[-1] == "length"
    assert usage is not None and usage.completion_tokens == 7


async def test_openai_sdk_completion_and_embeddings_and_adapters(
    client: tuple[openai.AsyncOpenAI, RouterProcess],
) -> None:
    sdk, _ = client
    completion = await sdk.completions.create(model=MODEL, prompt="Once upon", max_tokens=3)
    assert completion.object == "text_completion"
    assert completion.choices[0].text

    on_adapter = await sdk.completions.create(model=ADAPTER, prompt="SELECT", max_tokens=2)
    assert on_adapter.model == ADAPTER

    embeddings = await sdk.embeddings.create(model=MODEL, input=["one", "two"])
    assert [item.index for item in embeddings.data] == [0, 1]
    assert all(len(item.embedding) > 0 for item in embeddings.data)


async def test_openai_sdk_lists_the_engines_models(
    client: tuple[openai.AsyncOpenAI, RouterProcess],
) -> None:
    sdk, _ = client
    ids = [model.id async for model in sdk.models.list()]
    assert MODEL in ids
    assert ADAPTER in ids


async def test_unknown_model_is_an_openai_not_found_error(
    client: tuple[openai.AsyncOpenAI, RouterProcess],
) -> None:
    sdk, _ = client
    with pytest.raises(openai.NotFoundError) as raised:
        await sdk.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hello"}]
        )
    error = raised.value
    assert error.status_code == 404
    assert error.type == "invalid_request_error"
    assert error.code == "model_not_found"
    assert "no-such-model" in error.message
    document = error.response.json()
    assert set(document) == {"error"}
    assert set(document["error"]) >= {"message", "type", "code"}


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
async def test_curl_streams_a_chat_completion(
    client: tuple[openai.AsyncOpenAI, RouterProcess],
) -> None:
    _, router = client
    process = await asyncio.create_subprocess_exec(
        CURL,
        "-sS",
        "-N",
        "--max-time",
        "10",
        "-H",
        "content-type: application/json",
        "-d",
        f'{{"model": "{MODEL}", "stream": true, "max_tokens": 4,'
        ' "messages": [{"role": "user", "content": "hi"}]}',
        router.url + "/v1/chat/completions",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 15)
    assert process.returncode == 0, err.decode()
    events = [line for line in out.decode().split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert len(events) == 5
    assert all(event.startswith("data: {") for event in events[:-1])


# ------------------------------------------------------------------ metrics, k8s-pods mode

NAMESPACE = "default"
POD_IPS = ("127.0.0.2", "127.0.0.3")


@contextlib.asynccontextmanager
async def two_pod_cluster(tmp_path: Path) -> AsyncIterator[tuple[SimCluster, RouterFlags]]:
    """Two engine pods (`good`, `flaky`) on their own loopback IPs, and a router's flags."""
    async with sim_cluster(tmp_path, POD_IPS, namespace=NAMESPACE) as cluster:
        for ip, name in zip(POD_IPS, ("good", "flaky"), strict=True):
            await cluster.add_engine(name, ip, model=MODEL)
        flags = cluster.router_flags(Timings(probe_interval=30, drain_delay=0))
        yield cluster, replace(flags, routing=RoutingName.ROUND_ROBIN)


def exported(text: str) -> dict[str, list[Sample]]:
    """Family name as exposed (counters with `_total`) -> samples.

    prometheus_client adds a `<name>_created` timestamp to each counter and
    histogram; the parser reads those as families of their own. They are left out.
    """
    parsed = list(text_string_to_metric_families(text))
    created = {f"{f.name}_created" for f in parsed if f.type in ("counter", "histogram")}
    return {
        f"{family.name}_total" if family.type == "counter" else family.name: family.samples
        for family in parsed
        if family.name not in created
    }


async def send_chats(router: RouterProcess, count: int) -> list[int]:
    return [(await router.client.chat(MODEL))[0] for _ in range(count)]


async def test_metrics_export_exactly_the_design_families_with_their_labels(
    tmp_path: Path,
) -> None:
    async with (
        two_pod_cluster(tmp_path) as (cluster, flags),
        RouterProcess(flags) as router,
    ):
        await wait_until(lambda: routable_count(router, 2), timeout=10, what="2 routable")
        assert await send_chats(router, 4) == [200] * 4
        flaky = cluster.engines["flaky"]
        await flaky.set_fail_mode("refuse")  # still Ready in the API, probes far apart
        assert await send_chats(router, 4) == [200] * 4, "refused connects fail over"

        families = exported(await router.client.metrics())

    assert set(families) == EXPORTED_METRICS, (
        f"missing {sorted(EXPORTED_METRICS - set(families))}, "
        f"unexpected {sorted(set(families) - EXPORTED_METRICS)}"
    )
    for name, samples in families.items():
        if name in RESUME_METRIC_LABELS:
            assert not samples, f"{name} has a sample though no stream broke"
            continue
        assert samples, f"{name} has no sample after traffic, a failover and a sync"
        for sample in samples:
            labels = set(sample.labels) - ({"le"} if name in HISTOGRAMS else set())
            assert labels == METRIC_LABELS[name], (name, sample)

    def value(name: str, **labels: str) -> float:
        return sum(
            s.value
            for s in families[name]
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    assert value("headcount_requests_total", model=MODEL, code="200", outcome="ok") == 8
    assert value("headcount_upstream_failovers_total", reason="connect_failed") >= 1
    assert value("headcount_discovery_relists_total", source="k8s-pods", reason="start") == 1
    assert value("headcount_discovery_watch_connected", source="k8s-pods") == 1
    assert value("headcount_engines", state="ready") == 1
    assert value("headcount_engines", state="unhealthy") == 1, "the refusing engine is ejected"


async def test_an_engine_series_disappears_with_its_pod(tmp_path: Path) -> None:
    async with (
        two_pod_cluster(tmp_path) as (cluster, flags),
        RouterProcess(flags) as router,
    ):
        await wait_until(lambda: routable_count(router, 2), timeout=10, what="2 routable")
        assert await send_chats(router, 2) == [200, 200]

        def engines_in(text: str) -> set[str]:
            samples = exported(text)["headcount_engine_in_flight"]
            return {s.labels["engine"] for s in samples}

        client = router.client
        assert engines_in(await client.metrics()) == {f"{NAMESPACE}/good", f"{NAMESPACE}/flaky"}

        cluster.api.delete_pod(NAMESPACE, "flaky")

        async def flaky_gone() -> bool:
            return engines_in(await client.metrics()) == {f"{NAMESPACE}/good"}

        await wait_until(flaky_gone, timeout=5, what="flaky's series gone")
        text = await client.metrics()
        assert "flaky" not in text
        assert exported(text)["headcount_discovery_reconcile_removed_total"][0].value == 0
