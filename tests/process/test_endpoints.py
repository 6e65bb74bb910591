"""vLLM's other endpoints through the real router: routed by model, Responses kept on their engine.

A router process in front of simulated engines, each serving its own model or
the same one: every endpoint vLLM serves besides chat is routed by its body's
`model` (a form field for audio uploads), `/v1/models/{id}` is the router's own
answer, and the Responses API's follow-ups (`previous_response_id`, `GET`,
cancel) reach the engine that stored the response, or get an error that says
why they cannot.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import RouterFlags, RouterProcess, SimCluster, Timings, sim_cluster
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine
from tests.support import wait_until
from tests.support.router import MODEL, router_before

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

ALPHA, BETA = "alpha-model", "beta-model"
JSON_ENDPOINTS: dict[str, dict[str, Any]] = {
    "/v1/responses": {"input": "hello"},
    "/v1/rerank": {"query": "q", "documents": ["a", "b"]},
    "/rerank": {"query": "q", "documents": ["a"]},
    "/v1/score": {"text_1": "a", "text_2": "b"},
    "/score": {"text_1": "a", "text_2": ["b", "c"]},
    "/classify": {"input": "text"},
    "/pooling": {"input": ["text"]},
    "/tokenize": {"prompt": "hello there"},
    "/detokenize": {"tokens": [1, 2, 3]},
}


async def routable(router: RouterProcess, wanted: int) -> bool:
    body = await router.client.health()
    return bool(body["engines"]["routable"] == wanted)


@contextlib.asynccontextmanager
async def two_models(**flags: Any) -> AsyncIterator[tuple[RouterProcess, aiohttp.ClientSession]]:
    """Engine `a` serving ALPHA, engine `b` serving BETA, a router before them."""
    async with (
        running_engine(EngineSimConfig(model=ALPHA, name="a")) as a,
        running_engine(EngineSimConfig(model=BETA, name="b")) as b,
        RouterProcess(
            RouterFlags(
                discovery=DiscoveryMode.STATIC,
                backends=(a.url, b.url),
                timings=Timings(probe_interval=0.2, drain_delay=0),
                **flags,
            )
        ) as router,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
    ):
        await wait_until(lambda: routable(router, 2), timeout=10, what="both engines routable")
        yield router, http


async def post(http: aiohttp.ClientSession, url: str, **kwargs: Any) -> tuple[int, Any, str | None]:
    """Status, JSON body and the engine that answered (`x-engine-name`, None: the router)."""
    async with http.post(url, **kwargs) as response:
        return response.status, await response.json(), response.headers.get("x-engine-name")


async def test_each_endpoint_is_routed_by_its_model() -> None:
    async with two_models() as (router, http):
        for path, body in JSON_ENDPOINTS.items():
            for model, engine in ((ALPHA, "a"), (BETA, "b"), (ALPHA, "a")):
                status, answer, answered_by = await post(
                    http, router.url + path, json={"model": model, **body}
                )
                assert (status, answered_by) == (200, engine), (path, model, answer)
        status, answer, _ = await post(http, router.url + "/v1/rerank", json={"query": "q"})
        assert status == 400 and answer["error"]["code"] == "missing_model"


def audio_form(model: str | None) -> aiohttp.FormData:
    form = aiohttp.FormData()
    if model is not None:
        form.add_field("model", model)
    form.add_field("language", "en")
    form.add_field("file", b"RIFF" + bytes(4000), filename="a.wav", content_type="audio/wav")
    return form


async def test_audio_uploads_are_routed_by_the_form_model() -> None:
    async with two_models() as (router, http):
        for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            for model, engine in ((BETA, "b"), (ALPHA, "a")):
                status, answer, answered_by = await post(
                    http, router.url + path, data=audio_form(model)
                )
                assert (status, answered_by) == (200, engine), (path, answer)
                assert answer["text"].startswith(f"{engine} heard ")
        url = router.url + "/v1/audio/transcriptions"
        status, answer, answered_by = await post(http, url, data=audio_form(None))
        assert (status, answered_by) == (400, None)
        assert answer["error"]["code"] == "missing_model", answer
        status, answer, _ = await post(http, url, json={"model": ALPHA})
        assert status == 400 and answer["error"]["code"] == "not_a_form", answer


async def test_models_retrieve_answers_from_the_fleet() -> None:
    async with two_models() as (router, _http):
        sdk = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
        try:
            model = await sdk.models.retrieve(BETA)
            assert (model.id, model.object) == (BETA, "model")
            with pytest.raises(openai.NotFoundError) as raised:
                await sdk.models.retrieve("no-such-model")
            assert raised.value.code == "model_not_found"
        finally:
            await sdk.close()


async def test_other_v1_posts_pass_through_unless_turned_off() -> None:
    body = {"model": ALPHA, "messages": [{"role": "user", "content": "hi"}]}
    async with two_models() as (router, http):
        status, answer, answered_by = await post(
            http, router.url + "/v1/chat/completions/render", json=body
        )
        assert (status, answered_by) == (200, "a"), answer
    async with two_models(no_passthrough=True) as (router, http):
        status, answer, answered_by = await post(
            http, router.url + "/v1/chat/completions/render", json=body
        )
        assert (status, answered_by) == (404, None), answer
        assert answer["error"]["code"] == "not_found"


# ------------------------------------------------------------------ the Responses API


@contextlib.asynccontextmanager
async def three_engines() -> AsyncIterator[
    tuple[RouterProcess, openai.AsyncOpenAI, dict[str, SimEngine]]
]:
    """Three engines serving ALPHA behind a round-robin router (probes far apart, so only
    the proxy sees an engine fail), and an SDK client."""
    async with (
        running_engine(EngineSimConfig(model=ALPHA, name="a")) as a,
        running_engine(EngineSimConfig(model=ALPHA, name="b")) as b,
        running_engine(EngineSimConfig(model=ALPHA, name="c")) as c,
        RouterProcess(
            RouterFlags(
                discovery=DiscoveryMode.STATIC,
                backends=(a.url, b.url, c.url),
                routing=RoutingName.ROUND_ROBIN,
                timings=Timings(probe_interval=30, drain_delay=0),
            )
        ) as router,
    ):
        await wait_until(lambda: routable(router, 3), timeout=10, what="three engines routable")
        sdk = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
        try:
            yield router, sdk, {"a": a, "b": b, "c": c}
        finally:
            await sdk.close()


async def test_responses_follow_ups_reach_the_engine_that_stored_them() -> None:
    async with three_engines() as (router, sdk, _engines):
        first = await sdk.responses.with_raw_response.create(model=ALPHA, input="hello")
        stored_on = first.headers["x-engine-name"]
        previous = first.parse().id
        for turn in range(4):  # round-robin would move every other one
            raw = await sdk.responses.with_raw_response.create(
                model=ALPHA, input=f"turn {turn}", previous_response_id=previous
            )
            assert raw.headers["x-engine-name"] == stored_on, turn
            previous = raw.parse().id
        large = await sdk.responses.with_raw_response.create(  # read by a worker process
            model=ALPHA, input="long " * 20_000, previous_response_id=previous
        )
        assert large.headers["x-engine-name"] == stored_on
        previous = large.parse().id
        for _ in range(3):
            got = await sdk.responses.with_raw_response.retrieve(previous)
            assert got.headers["x-engine-name"] == stored_on
            assert got.parse().id == previous
        with pytest.raises(openai.BadRequestError) as raised:  # 404 from any other engine
            await sdk.responses.cancel(previous)
        assert "Cannot cancel a synchronous response" in str(raised.value)

        stream = await sdk.responses.create(model=ALPHA, input="streamed", stream=True)
        events = [event async for event in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        streamed = events[0].response.id
        for turn in range(3):
            raw = await sdk.responses.with_raw_response.create(
                model=ALPHA, input=f"again {turn}", previous_response_id=streamed
            )
            assert raw.parse().status == "completed"
        with pytest.raises(openai.NotFoundError) as raised:
            await sdk.responses.retrieve("resp_never_made")
        assert raised.value.code == "response_not_found"
        learned = await router.client.metrics()
        assert 'headcount_responses_affinity_total{outcome="followed"} 12.0' in learned


async def test_new_endpoints_fail_over_and_follow_ups_never_do() -> None:
    async with three_engines() as (router, sdk, engines), aiohttp.ClientSession() as http:
        previous, stored_on = await created_on(sdk)
        await engines[stored_on].set_fail_mode("refuse")
        with pytest.raises(openai.APIStatusError) as raised:  # never another engine's 404
            await sdk.responses.create(model=ALPHA, input="x", previous_response_id=previous)
        assert (raised.value.status_code, raised.value.code) == (502, "upstream_failed")
        with pytest.raises(openai.APIStatusError) as raised:  # the connect failure ejected it
            await sdk.responses.retrieve(previous)
        assert raised.value.status_code == 503
        assert raised.value.code == "response_engine_unavailable"
        assert f"engine {engines[stored_on].url}, which is out of rotation" in str(raised.value)
        await engines[stored_on].set_fail_mode("none")  # the others are tried first, then it
        await engines[next(name for name in engines if name != stored_on)].set_fail_mode("refuse")
        rerank = {"model": ALPHA, "query": "q", "documents": ["a"]}
        for _ in range(3):  # one of them goes to the refusing engine first
            status, answer, _ = await post(http, router.url + "/v1/rerank", json=rerank)
            assert status == 200, answer


async def created_on(sdk: openai.AsyncOpenAI) -> tuple[str, str]:
    raw = await sdk.responses.with_raw_response.create(model=ALPHA, input="hello")
    return raw.parse().id, raw.headers["x-engine-name"]


NAMESPACE = "default"
POD_IPS = ("127.0.0.4", "127.0.0.5")


@contextlib.asynccontextmanager
async def pods(tmp_path: Path) -> AsyncIterator[tuple[SimCluster, openai.AsyncOpenAI]]:
    async with sim_cluster(tmp_path, POD_IPS, namespace=NAMESPACE) as cluster:
        for ip, name in zip(POD_IPS, ("one", "two"), strict=True):
            await cluster.add_engine(name, ip, model=ALPHA)
        flags = cluster.router_flags(Timings(probe_interval=0.2, drain_delay=0))
        async with RouterProcess(replace(flags, routing=RoutingName.ROUND_ROBIN)) as router:
            await wait_until(lambda: routable(router, 2), timeout=10, what="2 routable")
            sdk = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
            try:
                yield cluster, sdk
            finally:
                await sdk.close()


async def test_a_follow_up_whose_engine_is_gone_gets_a_clear_error(tmp_path: Path) -> None:
    async with pods(tmp_path) as (cluster, sdk):
        asleep, asleep_on = await created_on(sdk)
        cluster.apply_pod(
            asleep_on,
            cluster.engines[asleep_on].config.host,
            model=ALPHA,
            labels={"sleeping": "true"},
        )

        async def refused() -> bool:
            try:
                await sdk.responses.create(model=ALPHA, input="x", previous_response_id=asleep)
            except openai.APIStatusError as error:
                return error.status_code == 503
            return False

        await wait_until(refused, timeout=10, what="the follow-up refused while asleep")
        with pytest.raises(openai.APIStatusError) as raised:
            await sdk.responses.retrieve(asleep)
        assert raised.value.status_code == 503
        assert raised.value.code == "response_engine_unavailable"
        assert asleep_on in raised.value.message

        cluster.api.delete_pod(NAMESPACE, asleep_on)

        async def gone() -> bool:
            try:
                await sdk.responses.create(model=ALPHA, input="x", previous_response_id=asleep)
            except openai.NotFoundError as error:
                return error.code == "response_engine_gone"
            except openai.APIStatusError:
                return False
            return False

        await wait_until(gone, timeout=10, what="the follow-up refused once the pod is gone")
        with pytest.raises(openai.NotFoundError) as gone_raised:
            await sdk.responses.cancel(asleep)
        assert gone_raised.value.code == "response_engine_gone"
        assert "left the fleet" in gone_raised.value.message
        fresh = await sdk.responses.create(model=ALPHA, input="anew")
        assert fresh.status == "completed", "new conversations go on"


TENANTS = """
[[tenant]]
name = "rag"
keys = ["sk-rag"]
requests_per_minute = 2
"""


async def test_new_endpoints_need_a_key_and_meet_flow_control(tmp_path: Path) -> None:
    async with (
        running_engine(EngineSimConfig(model=MODEL)) as engine,
        router_before([engine.url], tmp_path, client_keys=None, tenants=TENANTS) as running,
    ):
        await wait_until(
            lambda: running.router.fleet.snapshot.candidates(MODEL) != (),
            timeout=10,
            what="the engine routable",
        )
        rerank = {"model": MODEL, "query": "q", "documents": ["a"]}
        status, text, _ = await running.post("/v1/rerank", rerank)
        assert status == 401, text
        status, text, _ = await running.get("/v1/responses/resp_1")
        assert status == 401, text
        keyed = {"Authorization": "Bearer sk-rag"}
        statuses = [(await running.post("/v1/rerank", rerank, keyed))[0] for _ in range(3)]
        assert statuses == [200, 200, 429]
        status, text, _ = await running.post("/score", {"model": MODEL, "text_1": "a"}, keyed)
        assert status == 429 and "rate_limit_exceeded" in text


async def test_the_sim_keeps_responses_as_vllm_does() -> None:
    """The engine stand-in: an unknown id is 404 in vLLM's words, a background response can be
    cancelled before it completes, a synchronous one cannot, `store: false` keeps nothing."""
    config = EngineSimConfig(model=MODEL, token_delay=0.05)
    async with running_engine(config) as engine, aiohttp.ClientSession() as http:
        url = engine.url + "/v1/responses"
        status, answer, _ = await post(
            http, url, json={"model": MODEL, "input": "x", "previous_response_id": "resp_no"}
        )
        assert (
            status == 404 and answer["error"]["message"] == "Response with id 'resp_no' not found."
        )
        status, queued, _ = await post(
            http,
            url,
            json={"model": MODEL, "input": "x", "background": True, "max_output_tokens": 50},
        )
        assert (status, queued["status"]) == (200, "queued")
        status, cancelled, _ = await post(http, f"{url}/{queued['id']}/cancel")
        assert (status, cancelled["status"]) == (200, "cancelled")
        status, done, _ = await post(http, url, json={"model": MODEL, "input": "x"})
        assert (status, done["status"], done["object"]) == (200, "completed", "response")
        status, answer, _ = await post(http, f"{url}/{done['id']}/cancel")
        assert (
            status == 400 and "Cannot cancel a synchronous response" in answer["error"]["message"]
        )
        status, unstored, _ = await post(
            http, url, json={"model": MODEL, "input": "x", "store": False, "max_output_tokens": 1}
        )
        async with http.get(f"{url}/{unstored['id']}") as response:
            assert response.status == 404
