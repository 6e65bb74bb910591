"""Proves the engine simulator behaves like the vLLM server the router will meet.

Every test talks HTTP to a real engine on 127.0.0.1 through aiohttp: the
OpenAI shapes, streaming that really is incremental, metrics computed from the
real scheduler state, each failure mode as a client experiences it, and the
command-line entry point as a subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from headcount.sim.engine import (
    EngineSimConfig,
    SimEngine,
    Timebase,
    add_arguments,
    config_from_args,
    running_engine,
)
from headcount.sim.loopback import free_port
from tests.support import FakeClock, wait_until
from tests.support.stepped_engine import SteppedEngine

TIMEOUT = aiohttp.ClientTimeout(total=5)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as client:
        yield client


@pytest.fixture
async def engine() -> AsyncIterator[SimEngine]:
    config = EngineSimConfig(adapters=("sql-lora",), name="engine-a")
    async with running_engine(config) as running:
        yield running


def chat_request(model: str = "sim-model", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "say hi"}], **extra}


async def post_json(
    session: aiohttp.ClientSession, url: str, body: object
) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


async def read_events(response: aiohttp.ClientResponse) -> list[tuple[float, bytes]]:
    """Each SSE `data:` payload with the monotonic time it arrived."""
    events = []
    async for line in response.content:
        if line.startswith(b"data: "):
            events.append((time.monotonic(), line[len(b"data: ") :].rstrip()))
    return events


async def hold_stream(session: aiohttp.ClientSession, url: str, body: object) -> None:
    """Read a stream until cancelled, then hang up."""
    response = await session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=None))
    try:
        await response.read()
    finally:
        response.close()


async def metric_values(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_models_lists_base_model_and_adapters(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    async with session.get(f"{engine.url}/v1/models") as response:
        assert response.status == 200
        payload = await response.json()
    assert payload["object"] == "list"
    base, adapter = payload["data"]
    assert base["id"] == "sim-model" and base["parent"] is None and base["root"] == "sim-model"
    assert adapter["id"] == "sql-lora" and adapter["parent"] == "sim-model"
    assert adapter["root"] == "/adapters/sql-lora"
    for card in (base, adapter):
        assert card["object"] == "model" and card["owned_by"] == "vllm"
        assert card["max_model_len"] == 4096 and isinstance(card["created"], int)


async def test_unknown_model_is_404_with_openai_error(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    status, payload = await post_json(
        session, f"{engine.url}/v1/chat/completions", chat_request("no-such-model")
    )
    assert status == 404
    assert payload["error"]["code"] == 404 and "no-such-model" in payload["error"]["message"]
    assert payload["error"]["type"] == "NotFoundError"


async def test_bad_json_is_400_with_openai_error(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        async with session.post(f"{engine.url}{path}", data=b"{not json") as response:
            assert response.status == 400
            payload = await response.json()
        assert payload["error"]["code"] == 400 and payload["error"]["type"] == "BadRequestError"


async def test_chat_completion_has_vllm_shape(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    headers = {"x-request-id": "req-42"}
    url = f"{engine.url}/v1/chat/completions"
    async with session.post(url, json=chat_request(max_tokens=5), headers=headers) as response:
        assert response.status == 200
        assert response.headers["x-engine-name"] == "engine-a"
        assert response.headers["x-request-id"] == "req-42"
        payload = await response.json()
    assert payload["id"] == "chatcmpl-req-42"
    assert payload["object"] == "chat.completion"
    assert payload["model"] == "sim-model" and payload["system_fingerprint"] == "engine-a"
    (choice,) = payload["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    # ChatML around "say hi": <|im_start|> user \n say ␣hi <|im_end|> \n <|im_start|> assistant \n
    assert payload["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


async def test_text_completion_for_an_adapter_has_vllm_shape(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    status, payload = await post_json(
        session, f"{engine.url}/v1/completions", {"model": "sql-lora", "prompt": "SELECT"}
    )
    assert status == 200
    assert payload["id"].startswith("cmpl-") and payload["object"] == "text_completion"
    assert payload["model"] == "sql-lora" and payload["system_fingerprint"] == "engine-a"
    assert payload["choices"][0]["text"] and payload["usage"]["completion_tokens"] == 16
    assert engine.stats()["served"] == 1


@pytest.mark.parametrize("token_delay", [0.0, 0.001], ids=["instant", "paced"])
async def test_streamed_chat_is_chunks_then_usage_then_done(
    token_delay: float, session: aiohttp.ClientSession
) -> None:
    async with running_engine(EngineSimConfig(token_delay=token_delay)) as engine:
        url = f"{engine.url}/v1/chat/completions"
        body = chat_request(max_tokens=4, stream=True, stream_options={"include_usage": True})
        async with session.post(url, json=body) as response:
            assert response.status == 200
            assert response.content_type == "text/event-stream"
            events = [data for _, data in await read_events(response)]
        status, whole = await post_json(session, url, chat_request(max_tokens=4))
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(data) for data in events[:-1]]
    *token_chunks, usage_chunk = chunks
    assert len(token_chunks) == 4
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]}
    assert token_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None, None, None, "length"]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 4
    streamed_text = "".join(c["choices"][0]["delta"]["content"] for c in token_chunks)
    assert status == 200 and streamed_text == whole["choices"][0]["message"]["content"]


async def test_streamed_completion_chunks_carry_text(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 3, "stream": True}
    async with session.post(f"{engine.url}/v1/completions", json=body) as response:
        events = [data for _, data in await read_events(response)]
    assert events[-1] == b"[DONE]" and len(events) == 4
    chunks = [json.loads(data) for data in events[:-1]]
    assert all(c["object"] == "text_completion" and c["choices"][0]["text"] for c in chunks)
    assert all(c["usage"] is None for c in chunks)  # vLLM writes every field of these


async def test_a_stream_asking_for_continuous_usage_has_it_on_every_chunk_then_the_total(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    options = {"continuous_usage_stats": True}  # include_usage: vLLM's default, true
    body = chat_request(max_tokens=3, stream=True, stream_options=options)
    async with session.post(f"{engine.url}/v1/chat/completions", json=body) as response:
        events = [data for _, data in await read_events(response)]
    assert events[-1] == b"[DONE]"
    *chunks, total = [json.loads(data) for data in events[:-1]]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3]
    assert total["choices"] == [] and total["usage"] == chunks[-1]["usage"]


async def test_stream_chunks_arrive_as_they_are_generated(
    session: aiohttp.ClientSession,
) -> None:
    async with running_engine(EngineSimConfig(token_delay=0.05)) as engine:
        body = chat_request(max_tokens=10, stream=True)
        async with session.post(f"{engine.url}/v1/chat/completions", json=body) as response:
            events = await read_events(response)
    token_times = [arrived for arrived, _ in events[:-1]]
    assert len(token_times) == 10
    # nine token delays separate the first and last chunk: 0.45 s if nothing buffers
    assert token_times[-1] - token_times[0] > 0.3


async def test_embeddings_are_deterministic_per_input(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    url = f"{engine.url}/v1/embeddings"
    status, many = await post_json(session, url, {"model": "sim-model", "input": ["a", "b"]})
    _, single = await post_json(session, url, {"model": "sim-model", "input": "a"})
    assert status == 200 and many["object"] == "list"
    first, second = (item["embedding"] for item in many["data"])
    assert single["data"][0]["embedding"] == first != second
    assert abs(sum(x * x for x in first) - 1.0) < 1e-3


async def test_metrics_follow_running_and_waiting_requests(
    session: aiohttp.ClientSession,
) -> None:
    config = EngineSimConfig(token_delay=0.05, max_running=1, model="m")
    async with running_engine(config) as engine:
        body = chat_request("m", max_tokens=200, stream=True)
        url = f"{engine.url}/v1/chat/completions"
        requests = [asyncio.create_task(hold_stream(session, url, body)) for _ in range(3)]
        try:
            values = await wait_until(
                lambda: _load_is(session, engine.url, running=1, waiting=2),
                what="1 running and 2 waiting",
            )
            assert values["vllm:kv_cache_usage_perc"] == 1.0
        finally:
            for request in requests:
                request.cancel()
            await asyncio.gather(*requests, return_exceptions=True)
        await wait_until(
            lambda: _load_is(session, engine.url, running=0, waiting=0),
            what="queue drained after the clients left",
        )
        assert engine.stats()["disconnects"] == 3


async def _load_is(
    session: aiohttp.ClientSession, url: str, *, running: int, waiting: int
) -> dict[str, float] | None:
    values = await metric_values(session, url)
    load = (values["vllm:num_requests_running"], values["vllm:num_requests_waiting"])
    return values if load == (running, waiting) else None


async def test_requests_beyond_max_running_wait_in_order_and_their_wait_is_in_their_ttft(
    session: aiohttp.ClientSession,
) -> None:
    clock = FakeClock(0.0, sleeps="step")
    config = EngineSimConfig(token_delay=1.0, max_running=2)  # 3 tokens: 3 s a request
    async with running_engine(config, Timebase(clock, clock.sleep)) as engine:
        stepped = SteppedEngine(engine, clock, session)
        for queued in range(1, 6):
            await stepped.send(chat_request(max_tokens=3, stream=True), queued=queued)
        loads = []
        for _ in range(20):
            values = await stepped.step()
            if values is None:
                break
            loads.append((values["vllm:num_requests_running"], values["vllm:num_requests_waiting"]))
        ttfts = [stream.first_token_at for stream in stepped.streams]
        assert all(stream.tokens == 3 for stream in stepped.streams)
        final = await stepped.metrics()
    # two run from 0 to 3 s, two from 3 to 6, the last from 6 to 9: first come first served
    assert ttfts == [1.0, 1.0, 4.0, 4.0, 7.0]
    assert loads == [(2, 3)] * 3 + [(2, 1)] * 3 + [(1, 0)] * 3  # at 0..8 s
    assert (final["vllm:num_requests_running"], final["vllm:num_requests_waiting"]) == (0, 0)


async def test_a_request_cancelled_while_waiting_gives_its_turn_to_the_next(
    session: aiohttp.ClientSession,
) -> None:
    clock = FakeClock(0.0, sleeps="step")
    config = EngineSimConfig(token_delay=1.0, max_running=2)
    async with running_engine(config, Timebase(clock, clock.sleep)) as engine:
        stepped = SteppedEngine(engine, clock, session)
        streams = [
            await stepped.send(chat_request(max_tokens=3, stream=True), queued=queued)
            for queued in range(1, 6)
        ]
        gone = streams[3].task
        assert gone is not None
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        values = await wait_until(
            lambda: _load_is(session, engine.url, running=2, waiting=2), what="one waiting less"
        )
        assert values["vllm:num_requests_waiting"] == 2
        for _ in range(20):
            if await stepped.step() is None:
                break
        assert engine.stats()["disconnects"] == 1
    assert [stream.first_token_at for stream in streams] == [1.0, 1.0, 4.0, None, 4.0]


async def test_metrics_carry_vllm_names_and_model_label(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    await post_json(session, f"{engine.url}/v1/completions", {"prompt": "x", "max_tokens": 1})
    async with session.get(f"{engine.url}/metrics") as response:
        text = await response.text()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    success = families["vllm:request_success"]
    assert success.type == "counter" and success.samples[0].value == 1.0
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert families[name].samples[0].labels["model_name"] == "sim-model"


async def test_legacy_metrics_use_the_gpu_cache_name(session: aiohttp.ClientSession) -> None:
    async with running_engine(EngineSimConfig(legacy_metrics=True)) as engine:
        values = await metric_values(session, engine.url)
    assert "vllm:gpu_cache_usage_perc" in values and "vllm:kv_cache_usage_perc" not in values
    assert values["vllm:generation_tokens_total"] == values["vllm:prompt_tokens_total"] == 0.0


async def test_token_counters_move_while_an_unstreamed_answer_is_generated_and_not_stalled(
    session: aiohttp.ClientSession,
) -> None:
    """vLLM counts tokens as it generates them, whatever the answer's head waits for: a
    router tells a busy engine from a wedged one by these counters (`proxy/stalls.py`)."""
    async with running_engine(EngineSimConfig(token_delay=0.01, model="m")) as engine:
        url = f"{engine.url}/v1/chat/completions"
        answer = asyncio.create_task(post_json(session, url, chat_request("m", max_tokens=300)))
        counted = await wait_until(
            lambda: _generated(session, engine.url, 1), what="tokens counted mid-answer"
        )
        assert not answer.done() and counted["vllm:prompt_tokens_total"] > 0
        await post_json(session, f"{engine.url}/sim/fail-mode", {"mode": "stall"})
        frozen = (await metric_values(session, engine.url))["vllm:generation_tokens_total"]
        await asyncio.sleep(0.3)  # 30 tokens' time: a stalled engine generates none of them
        assert (await metric_values(session, engine.url))["vllm:generation_tokens_total"] == frozen
        assert frozen < 300 and not answer.done()
        await post_json(session, f"{engine.url}/sim/fail-mode", {"mode": "none"})
        status, body = await asyncio.wait_for(answer, timeout=5)
        values = await metric_values(session, engine.url)
    assert status == 200 and values["vllm:generation_tokens_total"] == 300.0
    assert values["vllm:prompt_tokens_total"] == body["usage"]["prompt_tokens"]


async def _generated(
    session: aiohttp.ClientSession, url: str, at_least: float
) -> dict[str, float] | None:
    values = await metric_values(session, url)
    return values if values.get("vllm:generation_tokens_total", 0.0) >= at_least else None


async def test_refuse_closes_the_port_and_restoring_listens_on_the_same_port(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    url, port = engine.url, engine.port
    await engine.set_fail_mode("refuse")
    with pytest.raises(aiohttp.ClientConnectorError) as refused:
        await session.get(f"{url}/health")
    assert refused.value.os_error.errno == errno.ECONNREFUSED
    await engine.set_fail_mode("none")
    assert engine.port == port
    async with session.get(f"{url}/health") as response:
        assert response.status == 200


async def test_refuse_over_admin_api_answers_then_refuses(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    status, payload = await post_json(session, f"{engine.url}/sim/fail-mode", {"mode": "refuse"})
    assert (status, payload) == (200, {"mode": "refuse"})
    with pytest.raises(aiohttp.ClientConnectorError):
        await session.get(f"{engine.url}/sim/stats")


async def test_refuse_drops_open_connections(session: aiohttp.ClientSession) -> None:
    async with running_engine(EngineSimConfig(token_delay=0.02)) as engine:
        body = chat_request(max_tokens=100, stream=True)
        async with session.post(f"{engine.url}/v1/chat/completions", json=body) as response:
            await response.content.readline()
            await engine.set_fail_mode("refuse")
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
        assert engine.stats()["running"] == 0


async def test_hang_leaves_clients_waiting_until_the_mode_changes(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    status, _ = await post_json(session, f"{engine.url}/sim/fail-mode", {"mode": "hang"})
    assert status == 200
    short = aiohttp.ClientTimeout(total=0.3)
    for path in ("/health", "/metrics", "/v1/models"):
        with pytest.raises(asyncio.TimeoutError):
            await session.get(f"{engine.url}{path}", timeout=short)
    pending = asyncio.create_task(
        post_json(session, f"{engine.url}/v1/chat/completions", chat_request(max_tokens=2))
    )
    await wait_until(lambda: engine.stats()["in_flight"] == 1, what="the request to hang")
    async with session.get(f"{engine.url}/sim/stats") as response:
        assert (await response.json())["in_flight"] == 1
    assert not pending.done()
    await post_json(session, f"{engine.url}/sim/fail-mode", {"mode": "none"})
    status, payload = await asyncio.wait_for(pending, timeout=5)
    assert status == 200 and payload["usage"]["completion_tokens"] == 2


async def test_die_mid_stream_breaks_streams_after_two_chunks(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    await engine.set_fail_mode("die-mid-stream")
    body = chat_request(max_tokens=10, stream=True)
    received: list[bytes] = []
    async with session.post(f"{engine.url}/v1/chat/completions", json=body) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for line in response.content:
                if line.strip():
                    received.append(line)
    assert len(received) == 2 and b"[DONE]" not in b"".join(received)
    with pytest.raises(aiohttp.ClientOSError) as reset:  # RST: tests/process/test_sim_resume.py
        await session.post(f"{engine.url}/v1/chat/completions", json=chat_request())
    assert reset.value.errno == errno.ECONNRESET
    assert engine.stats()["served"] == 0


async def test_http_500_fails_the_api_but_not_health(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    await engine.set_fail_mode("http-500")
    status, payload = await post_json(session, f"{engine.url}/v1/chat/completions", chat_request())
    assert status == 500 and payload["error"]["code"] == 500
    async with session.get(f"{engine.url}/v1/models") as response:
        assert response.status == 500
    async with session.get(f"{engine.url}/health") as response:
        assert response.status == 200


async def test_a_prompt_it_cannot_encode_is_a_json_500_never_a_traceback(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    body = b'{"model": "sim-model", "messages": [{"role": "user", "content": "\\ud800"}]}'
    url = f"{engine.url}/v1/chat/completions"
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as got:
        assert got.status == 500 and got.content_type == "application/json"
        error = (await got.json())["error"]
    assert error["type"] == "InternalServerError" and "surrogates not allowed" in error["message"]
    assert "Traceback" not in error["message"]


async def test_client_disconnect_mid_stream_frees_the_slot(
    session: aiohttp.ClientSession,
) -> None:
    config = EngineSimConfig(token_delay=0.02, max_running=1)
    async with running_engine(config) as engine:
        body = chat_request(max_tokens=1000, stream=True)
        response = await session.post(f"{engine.url}/v1/chat/completions", json=body)
        await response.content.readline()
        assert engine.stats()["running"] == 1
        response.close()
        await wait_until(lambda: engine.stats()["running"] == 0, what="the slot to be freed")
        assert engine.stats()["disconnects"] == 1 and engine.stats()["in_flight"] == 0
        status, _ = await post_json(
            session, f"{engine.url}/v1/chat/completions", chat_request(max_tokens=1)
        )
        assert status == 200


async def test_client_disconnect_while_waiting_leaves_the_queue(
    session: aiohttp.ClientSession,
) -> None:
    config = EngineSimConfig(token_delay=0.02, max_running=1)
    async with running_engine(config) as engine:
        url = f"{engine.url}/v1/chat/completions"
        body = chat_request(max_tokens=1000, stream=True)
        async with session.post(url, json=body) as running:
            await running.content.readline()
            waiter = asyncio.create_task(hold_stream(session, url, body))
            await wait_until(lambda: engine.stats()["waiting"] == 1, what="a queued request")
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            await wait_until(lambda: engine.stats()["waiting"] == 0, what="the queue to empty")
            assert engine.stats()["running"] == 1 and engine.stats()["disconnects"] == 1


async def test_adapter_changes_show_in_models_and_routing(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    status, _ = await post_json(session, f"{engine.url}/sim/adapters", {"adapters": ["new-lora"]})
    assert status == 200
    async with session.get(f"{engine.url}/v1/models") as response:
        ids = [card["id"] for card in (await response.json())["data"]]
    assert ids == ["sim-model", "new-lora"]
    url = f"{engine.url}/v1/chat/completions"
    assert (await post_json(session, url, chat_request("new-lora")))[0] == 200
    assert (await post_json(session, url, chat_request("sql-lora")))[0] == 404


async def test_every_response_names_the_engine(
    engine: SimEngine, session: aiohttp.ClientSession
) -> None:
    async with session.get(f"{engine.url}/no/such/path") as response:
        assert response.status == 404
        assert response.headers["x-engine-name"] == "engine-a"


def test_command_line_options_build_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = "--port 9 --adapters a,,b --token-delay 0.5 --fail-mode hang --max-running 3"
    config = config_from_args(parser.parse_args([*args.split(), "--legacy-metrics"]))
    assert config == EngineSimConfig(
        port=9,
        adapters=("a", "b"),
        token_delay=0.5,
        fail_mode="hang",
        max_running=3,
        legacy_metrics=True,
    )
    assert config_from_args(parser.parse_args([])) == EngineSimConfig()


def test_prefix_cache_options_build_the_config(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    (tmp_path / "tokenizer.json").write_text("{}")
    args = f"--kv-blocks 100 --block-size 32 --prefill-tokens-per-s 8000 --tokenizer {tmp_path}"
    config = config_from_args(parser.parse_args(args.split()))
    assert (config.kv_blocks, config.block_size, config.prefill_tokens_per_s) == (100, 32, 8000.0)
    assert config.tokenizer == str(tmp_path)
    for bad in ("--kv-blocks 1", "--block-size 0", "--prefill-tokens-per-s 0", "--tokenizer /"):
        with pytest.raises(SystemExit):
            parser.parse_args(bad.split())


async def test_module_runs_as_a_program_and_stops_on_sigterm(
    session: aiohttp.ClientSession,
) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "headcount.sim.engine", "--port", str(port), "--name", "sub"),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=20)
        assert line.decode().strip() == f"sim-engine sub listening on http://127.0.0.1:{port}"
        async with session.get(f"http://127.0.0.1:{port}/health") as response:
            assert response.status == 200 and response.headers["x-engine-name"] == "sub"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_drain_finishes_running_streams_and_refuses_new_connections(
    session: aiohttp.ClientSession,
) -> None:
    async with running_engine(EngineSimConfig(token_delay=0.02)) as engine:
        body = {"model": "sim-model", "prompt": "hi", "max_tokens": 10, "stream": True}
        async with session.post(engine.url + "/v1/completions", json=body) as response:
            assert response.status == 200
            await response.content.readuntil(b"\n\n")
            drained = asyncio.create_task(engine.drain())
            rest = await response.read()
        await drained
        assert rest.endswith(b"data: [DONE]\n\n")
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(engine.url + "/health")
