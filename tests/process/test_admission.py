"""Admission's `Later`: a large body read by a worker process, a prompt tokenized by an engine.

Each is a `Later` from the one entry, whose awaitable yields the decision.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence

import pytest

from headcount.config import ProxySettings, RoutingName
from headcount.fleet import Engine
from headcount.proxy.admission import Admission, Admitted, Later, Refused
from headcount.routing import RequestFeatures, make_policy
from headcount.surfaces.metrics import UNKNOWN_MODEL
from tests.support import EngineConnection, Script, engine, raw_engine
from tests.support.admission import (
    SETTINGS,
    chat,
    error_code,
    fleet_of,
    kv_aware,
    request,
    upstreams,
)

TIMEOUT = 10.0
FLEET = fleet_of(engine("a", "m"), engine("b", "m", "m-lora"))


async def test_a_large_body_is_a_later_that_a_worker_process_resolves() -> None:
    policy = make_policy(RoutingName.SESSION, affinity_epsilon=1.0)
    admission = Admission(FLEET, policy, ProxySettings(inline_parse_max=64), upstreams())
    content = {"role": "user", "content": "x" * 200}
    body = json.dumps({"model": "m-lora", "user": "u1", "messages": [content]}).encode()
    try:
        later = admission.admit(request(body))
        malformed = admission.admit(request(b"{" + b" " * 200))
        assert isinstance(later, Later) and isinstance(malformed, Later)
        admitted = await asyncio.wait_for(later.decision, TIMEOUT)
        refused = await asyncio.wait_for(malformed.decision, TIMEOUT)
    finally:
        await admission.close()
    assert isinstance(admitted, Admitted) and admitted.engine.id == "b"
    assert admitted.features == RequestFeatures("m-lora", "u1")
    assert isinstance(refused, Refused) and error_code(refused) == "invalid_json"
    assert refused.answer.status == 400 and refused.label == UNKNOWN_MODEL


async def test_kv_aware_with_no_router_tokenizer_is_a_later_that_asks_an_engine() -> None:
    asked: list[bytes] = []

    async def tokenize(conn: EngineConnection) -> None:
        while (got := await conn.read_request()) is not None:
            asked.append(got[0].split(b" ")[1])
            answer = b'{"tokens": [1, 2, 3, 4, 5]}'
            await conn.send(
                b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer)
            )

    pools = upstreams()
    async with raw_engine(tokenize) as raw:
        engines = fleet_of(engine("a", "m", url=raw.url))
        admission = Admission(engines, kv_aware(None), SETTINGS, pools)
        try:
            later = admission.admit(request(chat()))
            embedding = b'{"model": "m", "input": "hi"}'
            at_once = admission.admit(request(embedding, path=b"/v1/embeddings"))
            large = admission.admit(request(chat() + b" " * SETTINGS.inline_parse_max))
            assert isinstance(later, Later) and isinstance(large, Later)
            admitted = await asyncio.wait_for(later.decision, TIMEOUT)
            by_load = await asyncio.wait_for(large.decision, TIMEOUT)
        finally:
            pools.close()
            await admission.close()
    assert isinstance(admitted, Admitted) and admitted.engine.id == "a"
    assert admitted.features.kv is not None and admitted.features.kv.ids == [1, 2, 3, 4, 5]
    assert asked == [b"/tokenize"]  # the embedding and the large body asked nothing
    assert isinstance(at_once, Admitted) and at_once.features.kv is not None
    assert at_once.features.kv.ids is None
    assert isinstance(by_load, Admitted) and by_load.features.kv is not None
    assert by_load.features.kv.ids is None


def tokenize_answer(tokens: list[int]) -> bytes:
    answer = json.dumps({"count": len(tokens), "tokens": tokens}, separators=(",", ":")).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer)


def answering(tokens: list[int], asked: list[bytes]) -> Script:
    """A `/tokenize` that answers `tokens` to every request, recording each request's head."""

    async def script(conn: EngineConnection) -> None:
        while (got := await conn.read_request()) is not None:
            asked.append(got[0])
            await conn.send(tokenize_answer(tokens))

    return script


async def prompt_ids(admission: Admission, count: int) -> list[Sequence[int] | None]:
    """The ids each of `count` chats, admitted one after the other, was routed with."""
    found: list[Sequence[int] | None] = []
    for _ in range(count):
        later = admission.admit(request(chat()))
        assert isinstance(later, Later)
        admitted = await asyncio.wait_for(later.decision, TIMEOUT)
        assert isinstance(admitted, Admitted) and admitted.features.kv is not None
        found.append(admitted.features.kv.ids)
    return found


async def test_an_engine_whose_tokenize_never_answers_is_asked_once_then_left_alone() -> None:
    hung_asked: list[bytes] = []
    fine_asked: list[bytes] = []

    async def hung(conn: EngineConnection) -> None:
        while (got := await conn.read_request()) is not None:
            hung_asked.append(got[0])
            await conn.reader.read()  # until the router gives up and closes

    pools = upstreams()
    async with raw_engine(hung) as silent, raw_engine(answering([7] * 5, fine_asked)) as fine:
        engines = fleet_of(engine("hung", "m", url=silent.url), engine("fine", "m", url=fine.url))
        for each in engines.snapshot.engines:
            each.load.in_flight = 5 if each.id == "fine" else 0  # the hung one reports less load
        admission = Admission(engines, kv_aware(None, tokenize_timeout=0.2), SETTINGS, pools)
        try:
            found = await prompt_ids(admission, 8)
        finally:
            pools.close()
            await admission.close()
    assert len(hung_asked) == 1
    assert found.count(None) == 1 and len(fine_asked) == 7


def with_context(built: Engine, max_model_len: int) -> Engine:
    return dataclasses.replace(built, cards=({"id": "m", "max_model_len": max_model_len},))


@pytest.mark.parametrize(
    ("answered", "max_model_len", "times_asked"),
    [
        # A prompt longer than the model's context: vLLM's /tokenize answers it all the same
        # (the engine refuses the request itself), so the engine is asked again.
        pytest.param(100, 64, 3, id="over-the-context"),
        # More ids than a body of that size can tokenize to, whatever the card claims: a liar.
        pytest.param(450_000, 10**9, 1, id="more-than-the-body-holds"),
    ],
)
async def test_more_ids_than_the_model_takes_are_not_used(
    answered: int, max_model_len: int, times_asked: int
) -> None:
    asked: list[bytes] = []
    pools = upstreams()
    async with raw_engine(answering([1] * answered, asked)) as raw:
        engines = fleet_of(with_context(engine("a", "m", url=raw.url), max_model_len))
        admission = Admission(engines, kv_aware(None), SETTINGS, pools)
        try:
            found = await prompt_ids(admission, 3)
        finally:
            pools.close()
            await admission.close()
    assert found == [None] * 3
    assert len(asked) == times_asked
