"""The router as clients use it: the official `openai` SDK and curl against a real process.

`headcount serve` runs as a child process in front of simulated engines; the
clients are the ones users run, so what they accept (SSE framing, error
bodies, model lists) is what is tested. The `/metrics` export is checked
against the families DESIGN.md promises (the list `test_deploy.py` pins for
the alert rules and dashboard), after real traffic, a failover and discovery
from the API server emulator, and an engine's series must go with its pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from headcount.sim.apiserver import ApiServerSim, ApiServerSimConfig, make_pod, running_apiserver
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine, start_engine
from tests.support import RouterProcess, wait_until_async
from tests.test_deploy import EXPORTED_METRICS, HISTOGRAMS, METRIC_LABELS

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

MODEL = "sim-model"
ADAPTER = "sql-lora"
CLIENT_TIMEOUT = 10.0
CURL = shutil.which("curl") or "/usr/bin/curl"
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=5)


# ------------------------------------------------------------------ static mode, real clients


@contextlib.asynccontextmanager
async def static_router() -> AsyncIterator[RouterProcess]:
    """A router in static mode before two ready simulated engines."""
    async with (
        running_engine(EngineSimConfig(model=MODEL, adapters=(ADAPTER,), name="a")) as a,
        running_engine(EngineSimConfig(model=MODEL, adapters=(ADAPTER,), name="b")) as b,
        RouterProcess(
            [
                "--discovery=static",
                f"--backends={a.url},{b.url}",
                "--probe-interval=0.2",
                "--drain-delay=0",
            ]
        ) as router,
    ):
        await wait_until_async(
            lambda: routable_count(router, 2), timeout=10, what="both engines routable"
        )
        yield router


async def routable_count(router: RouterProcess, wanted: int) -> bool:
    body = await router.get_json("/health")
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


def free_port_on_all(hosts: tuple[str, ...]) -> int:
    """A port free on every one of `hosts`: engine pods share one port, each on its own IP."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port: int = probe.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on all pod IPs")


@contextlib.asynccontextmanager
async def two_pod_cluster(
    tmp_path: Path,
) -> AsyncIterator[tuple[ApiServerSim, list[SimEngine], list[str]]]:
    """Two engine pods (`good`, `flaky`) on their own loopback IPs, and a router's flags."""
    port = free_port_on_all(POD_IPS)
    async with running_apiserver(ApiServerSimConfig(bookmark_interval=0.5)) as api:
        engines = [
            await start_engine(EngineSimConfig(host=ip, port=port, model=MODEL, name=name))
            for ip, name in zip(POD_IPS, ("good", "flaky"), strict=True)
        ]
        try:
            for engine, ip in zip(engines, POD_IPS, strict=True):
                api.apply_pod(
                    make_pod(
                        engine.name, labels={"app": "engine", "model": MODEL}, ip=ip, port=port
                    )
                )
            args = [
                "--discovery=k8s-pods",
                f"--kubeconfig={api.kubeconfig(tmp_path / 'kubeconfig', namespace=NAMESPACE)}",
                "--label-selector=app=engine",
                f"--engine-port={port}",
                "--routing=round-robin",
                "--probe-interval=30",
                "--drain-delay=0",
            ]
            yield api, engines, args
        finally:
            for engine in engines:
                await engine.stop()


async def scrape(router: RouterProcess) -> str:
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        async with session.get(router.url + "/metrics") as response:
            assert response.status == 200
            return await response.text()


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
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    statuses = []
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        for _ in range(count):
            async with session.post(router.url + "/v1/chat/completions", json=payload) as response:
                await response.read()
                statuses.append(response.status)
    return statuses


async def test_metrics_export_exactly_the_design_families_with_their_labels(
    tmp_path: Path,
) -> None:
    async with (
        two_pod_cluster(tmp_path) as (_, engines, args),
        RouterProcess(args) as router,
    ):
        await wait_until_async(lambda: routable_count(router, 2), timeout=10, what="2 routable")
        assert await send_chats(router, 4) == [200] * 4
        await engines[1].set_fail_mode("refuse")  # still Ready in the API, probes far apart
        assert await send_chats(router, 4) == [200] * 4, "refused connects fail over"

        families = exported(await scrape(router))

    assert set(families) == EXPORTED_METRICS, (
        f"missing {sorted(EXPORTED_METRICS - set(families))}, "
        f"unexpected {sorted(set(families) - EXPORTED_METRICS)}"
    )
    for name, samples in families.items():
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

    assert value("headcount_requests_total", model=MODEL, code="200") == 8
    assert value("headcount_upstream_failovers_total", reason="connect_failed") >= 1
    assert value("headcount_discovery_relists_total", source="k8s-pods", reason="start") == 1
    assert value("headcount_discovery_watch_connected", source="k8s-pods") == 1
    assert value("headcount_engines", state="ready") == 1
    assert value("headcount_engines", state="unhealthy") == 1, "the refusing engine is ejected"


async def test_an_engine_series_disappears_with_its_pod(tmp_path: Path) -> None:
    async with (
        two_pod_cluster(tmp_path) as (api, _, args),
        RouterProcess(args) as router,
    ):
        await wait_until_async(lambda: routable_count(router, 2), timeout=10, what="2 routable")
        assert await send_chats(router, 2) == [200, 200]

        def engines_in(text: str) -> set[str]:
            samples = exported(text)["headcount_engine_in_flight"]
            return {s.labels["engine"] for s in samples}

        assert engines_in(await scrape(router)) == {f"{NAMESPACE}/good", f"{NAMESPACE}/flaky"}

        api.delete_pod(NAMESPACE, "flaky")

        async def flaky_gone() -> bool:
            return engines_in(await scrape(router)) == {f"{NAMESPACE}/good"}

        await wait_until_async(flaky_gone, timeout=5, what="flaky's series gone")
        text = await scrape(router)
        assert "flaky" not in text
        assert exported(text)["headcount_discovery_reconcile_removed_total"][0].value == 0
