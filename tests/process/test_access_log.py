"""The access log's lines through the proxy: what each line says.

Through the proxy of `tests.support.routed.routed`, with a real engine, a
stream cut mid-answer, a failover and a refusal, read from the
`headcount.access` logger's records (their `extra` fields and their text).
Sampling on its own is tests/unit/test_access_log.py.
"""

from __future__ import annotations

import dataclasses
import logging

import aiohttp
import pytest

from headcount.tokens import builtin_tokenizer
from tests.support import blackholed_listener
from tests.support.kv_event_index import EventIndex
from tests.support.kv_routed import BS, ENGINES, QUESTIONS, ask, kv_policy, record
from tests.support.routed import CHAT, MODEL, SETTINGS, chat, routed, sim

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
