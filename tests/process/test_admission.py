"""Admission's `Later`: a large body read by a worker process, a prompt tokenized by an engine.

Each is a `Later` from the one entry, whose awaitable yields the decision.
"""

from __future__ import annotations

import asyncio
import json

from headcount.config import ProxySettings, RoutingName
from headcount.proxy.admission import Admission, Admitted, Later, Refused
from headcount.routing import RequestFeatures, make_policy
from headcount.surfaces.metrics import UNKNOWN_MODEL
from tests.support import EngineConnection, engine, raw_engine
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
