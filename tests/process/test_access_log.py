"""The access log's lines through the proxy: what each line says.

Through the proxy of `tests.support.routed.routed`, with a real engine, a
stream cut mid-answer, a failover and a refusal, read from the
`headcount.access` logger's records (their `extra` fields and their text).
Sampling on its own is tests/unit/test_access_log.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path

import aiohttp
import pytest

from headcount.sim.cluster.polling import wait_until
from headcount.sim.engine.config import EngineSimConfig
from headcount.sim.engine.server import running_engine
from headcount.tokens import builtin_tokenizer
from tests.support import blackholed_listener
from tests.support.kv_event_index import EventIndex
from tests.support.kv_routed import BS, ENGINES, QUESTIONS, ask, kv_policy, record
from tests.support.routed import CHAT, MODEL, SETTINGS, chat, routed, sim
from tests.support.router import router_before

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

EVERY = dataclasses.replace(SETTINGS, access_log_sample=1.0)


def access_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "headcount.access"]


# -- through the proxy --------------------------------------------------------------------------


async def test_a_proxied_request_gets_one_line_with_its_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    async with routed(sim("a"), settings=EVERY) as setup:
        headers = {"x-request-id": "req-42"}
        async with setup.session.post(setup.url + CHAT, json=chat(), headers=headers) as response:
            assert response.status == 200
            body = await response.read()
    (record,) = access_records(caplog)
    fields = record.__dict__
    assert fields["request_id"] == "req-42"
    assert (fields["method"], fields["path"], fields["model"]) == ("POST", CHAT, MODEL)
    assert fields["engine"] == setup.engine_ids[0]
    assert (fields["status"], fields["outcome"], fields["cut"]) == (200, "ok", False)
    assert fields["bytes_out"] == len(body) and fields["bytes_in"] > 0
    assert fields["failovers"] == 0 and fields["cached_tokens"] is None
    assert 0 <= fields["ttfb_ms"] <= fields["duration_ms"]
    assert "request_id=req-42" in record.getMessage()


async def test_a_cut_stream_is_logged_at_any_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    settings = dataclasses.replace(SETTINGS, access_log_sample=0.0001)
    async with routed(sim("a", fail_mode="die-mid-stream"), settings=settings) as setup:
        for _ in range(3):
            async with setup.session.post(setup.url + CHAT, json=chat(stream=True)) as response:
                assert response.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await response.read()
    records = access_records(caplog)
    assert len(records) == 3
    assert all(
        (r.__dict__["status"], r.__dict__["outcome"], r.__dict__["cut"]) == (200, "cut", True)
        for r in records
    )


async def test_a_failover_is_logged_at_any_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    settings = dataclasses.replace(SETTINGS, access_log_sample=0.0001)
    with blackholed_listener() as port:
        dead = f"http://127.0.0.1:{port}"
        async with routed(sim("a"), extra_urls=[dead], settings=settings) as setup:
            for _ in range(2):
                assert (await setup.post(CHAT, chat()))[0] == 200
    (record,) = access_records(caplog)
    assert record.__dict__["failovers"] == 1 and record.__dict__["status"] == 200


async def test_a_refused_request_is_logged_without_an_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    async with routed(sim("a"), settings=EVERY) as setup:
        assert (await setup.post(CHAT, {"model": "nope", "messages": []}))[0] == 404
    (record,) = access_records(caplog)
    assert record.__dict__["engine"] is None and record.__dict__["status"] == 404
    assert "engine=- status=404 outcome=ok" in record.getMessage()


async def test_rate_zero_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    settings = dataclasses.replace(SETTINGS, access_log_sample=0.0)
    async with routed(sim("a", fail_mode="http-500"), settings=settings) as setup:
        assert (await setup.post(CHAT, chat()))[0] == 500
    assert access_records(caplog) == []


async def test_a_kv_aware_line_carries_the_predicted_cached_tokens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    index = EventIndex(BS)
    policy = kv_policy(index, builtin_tokenizer())
    async with routed(*ENGINES[:1], policy=policy, settings=EVERY) as setup:
        record(setup, index)
        receipts = []
        for _ in range(2):  # the second finds the first's prefix cached
            status, _, headers = await setup.post(CHAT, ask(QUESTIONS[0]))
            assert status == 200
            receipts.append(int(headers["x-headcount-cached-tokens"]))
    logged = [r.__dict__["cached_tokens"] for r in access_records(caplog)]
    assert logged == receipts and logged[1] > 0


# -- what every line names -----------------------------------------------------------------------


async def test_every_non_2xx_is_logged_at_any_rate_with_the_model_asked_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    settings = dataclasses.replace(SETTINGS, access_log_sample=0.0001)
    async with routed(sim("a"), settings=settings) as setup:
        for _ in range(2):
            assert (await setup.post(CHAT, {"model": "nope", "messages": []}))[0] == 404
        assert (await setup.post(CHAT, "not an object"))[0] == 400
    assert [(r.__dict__["status"], r.__dict__["model"]) for r in access_records(caplog)] == [
        (404, "nope"),
        (404, "nope"),
        (400, "unknown"),
    ]


async def test_a_failover_line_names_every_engine_tried_with_its_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    async with routed(sim("a", fail_mode="http-500"), sim("b"), settings=EVERY) as setup:
        failing, answering = setup.engine_ids
        for _ in range(2):
            assert (await setup.post(CHAT, chat()))[0] == 200
    tried = {(r.__dict__["tried"], r.__dict__["engine"]) for r in access_records(caplog)}
    assert (f"{failing}:500", answering) in tried
    assert tried <= {(f"{failing}:500", answering), (None, answering)}


async def test_the_http_layers_refusals_carry_a_request_id_and_get_a_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    settings = dataclasses.replace(SETTINGS, max_body_size=1000, access_log_sample=0.0001)
    async with routed(sim("a"), settings=settings) as setup:
        too_large = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-id: big-1\r\n"
            b"content-type: application/json\r\ncontent-length: 5000\r\n\r\n"
        )
        head, body = await raw_exchange(setup.port, too_large)
        assert head.startswith(b"HTTP/1.1 413 ") and b"\r\nx-request-id: big-1\r\n" in head
        message = json.loads(body)["error"]["message"]
        assert "over 1000 bytes" in message and "--max-body-size" in message
        head, _ = await raw_exchange(setup.port, b"NOT HTTP AT ALL\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ") and b"\r\nx-request-id: " in head
    (large, malformed) = [r.__dict__ for r in access_records(caplog)]
    assert (large["request_id"], large["status"], large["path"]) == ("big-1", 413, CHAT)
    assert (malformed["status"], malformed["method"], malformed["path"]) == (400, "-", "-")


async def raw_exchange(port: int, request: bytes) -> tuple[bytes, bytes]:
    """Send raw bytes, read the answer until the router closes: its head and its body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return head + b"\r\n", body


async def test_a_line_names_the_tenant_and_the_tokens_flow_control_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    tenants = '[[tenant]]\nname = "metered"\nkeys = ["sk-metered"]\ntokens_per_minute = 100000\n'
    async with (
        running_engine(EngineSimConfig()) as engine,
        router_before(
            [engine.url], tmp_path, client_keys=None, tenants=tenants, access_log_sample=1.0
        ) as running,
    ):
        await wait_until(lambda: running.router.fleet.snapshot.routable, timeout=10)
        key = {"Authorization": "Bearer sk-metered"}
        for stream in (False, True):
            body = {**chat(stream=stream), "max_tokens": 3}
            assert (await running.post(CHAT, body, key))[0] == 200
    lines = [r.__dict__ for r in access_records(caplog)]
    assert [line["tenant"] for line in lines] == ["metered", "metered"]
    assert [line["completion_tokens"] for line in lines] == [3, 3]
    assert all(line["prompt_tokens"] > 0 for line in lines)
    assert "tenant=metered" in access_records(caplog)[0].getMessage()


async def test_without_flow_control_a_line_has_the_tokens_the_answer_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "headcount.access")
    asked = {"stream_options": {"include_usage": True}}
    async with routed(sim("a"), settings=EVERY) as setup:
        for body in (chat(), {**chat(stream=True), **asked}, chat(stream=True)):
            async with setup.session.post(setup.url + CHAT, json=body) as response:
                assert response.status == 200
                await response.read()
    lines = [record.__dict__ for record in access_records(caplog)]
    reported = [(line["prompt_tokens"], line["completion_tokens"]) for line in lines]
    assert all(p > 0 and c > 0 for p, c in reported[:2]), reported
    assert reported[2] == (None, None), "a stream that asked no usage reported none"
    assert f"completion_tokens={reported[0][1]}" in access_records(caplog)[0].getMessage()
