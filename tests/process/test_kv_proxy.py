"""Proves the data plane's side of `kv-aware` routing, through the real proxy on 127.0.0.1.

Requests land on the engine holding their prefix, and the route receipt
(`x-headcount-engine`, `x-headcount-cached-tokens`) tells the truth the
engine then reports; the prompt's ids come from the router's tokenizer or,
without one, an engine's `/tokenize`; a body over the inline bound is routed
by load; `prefill_queued` is held from dispatch to first byte and given back
on every path (answer, failover, client gone, connect failure); a failing
`/tokenize` never fails a request.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from headcount.tokens import ChatTokenizer, builtin_tokenizer
from tests.support import raw_engine, wait_until
from tests.support.kv_event_index import EventIndex
from tests.support.kv_routed import BS, ENGINES, QUESTIONS, ask, kv_policy, record
from tests.support.routed import CHAT, Routed, Silent, routed, sim


def prefill_queued(setup: Routed) -> list[int]:
    by_id = setup.fleet.snapshot.by_id
    return [by_id[engine_id].load.prefill_queued for engine_id in setup.engine_ids]


async def receipts(setup: Routed, questions: list[str]) -> list[tuple[str, int, int]]:
    """(receipt engine, receipt cached tokens, engine-reported cached tokens) per request."""
    seen = []
    for question in questions:
        status, body, headers = await setup.post(CHAT, ask(question))
        assert status == 200, body
        reported = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        seen.append(
            (headers["x-headcount-engine"], int(headers["x-headcount-cached-tokens"]), reported)
        )
    return seen


@pytest.mark.parametrize("tokenizer", [builtin_tokenizer(), None], ids=["router", "engine"])
async def test_warm_requests_land_on_the_engine_holding_the_prefix_with_a_true_receipt(
    tokenizer: ChatTokenizer | None,
) -> None:
    index = EventIndex(BS)
    async with routed(*ENGINES, policy=kv_policy(index, tokenizer)) as setup:
        record(setup, index)
        seen = await receipts(setup, QUESTIONS)
        assert all(predicted == reported for _, predicted, reported in seen), seen
        assert seen[0][1] == 0 and all(predicted > 150 for _, predicted, _ in seen[1:])
        assert len({engine for engine, _, _ in seen}) == 1  # the warm engine, every time
        assert prefill_queued(setup) == [0, 0, 0]
        routed_calls = [call for call in index.calls if call[0] == "routed"]
        assert [call[3] for call in routed_calls] == [p for _, p, _ in seen]
        assert len([call for call in index.calls if call[0] == "prefilled"]) == len(seen)


@pytest.mark.parametrize("over", [False, True])
async def test_only_bodies_up_to_the_inline_bound_are_tokenized_on_the_loop(over: bool) -> None:
    index = EventIndex(BS)
    size = len(json.dumps(ask(QUESTIONS[1])).encode())
    bound = size - 1 if over else size
    policy = kv_policy(index, builtin_tokenizer(), inline_tokenize_max=bound)
    async with routed(*ENGINES[:1], policy=policy) as setup:
        record(setup, index)
        await receipts(setup, QUESTIONS[:1])
        [(_, predicted, reported)] = await receipts(setup, QUESTIONS[1:2])
    assert reported > 0
    assert predicted == (0 if over else reported)


async def test_a_failing_engine_tokenize_routes_by_load_and_the_request_succeeds() -> None:
    index = EventIndex(BS)
    policy = kv_policy(index, None, tokenize_timeout=0.5)
    async with routed(sim("a", fail_mode="refuse"), sim("b"), policy=policy) as setup:
        for _ in range(4):
            status, _, headers = await setup.post(CHAT, ask("hi"))
            assert status == 200 and headers["x-headcount-cached-tokens"] == "0"
        assert prefill_queued(setup) == [0, 0]
        await wait_until(setup.all_released)


async def test_prefill_is_queued_until_the_first_byte_and_given_back_when_the_client_leaves() -> (
    None
):
    silent = Silent()
    index = EventIndex(BS)
    tokens = len(builtin_tokenizer().chat_ids(ask("wait")["messages"]))
    async with (
        raw_engine(silent) as engine,
        routed(extra_urls=[engine.url], policy=kv_policy(index, builtin_tokenizer())) as setup,
    ):
        request = asyncio.ensure_future(setup.post(CHAT, ask("wait")))
        await wait_until(lambda: silent.requests == 1, what="the request at the silent engine")
        assert prefill_queued(setup) == [tokens]
        request.cancel()
        await wait_until(lambda: prefill_queued(setup) == [0], what="prefill given back")
        await wait_until(setup.all_released)


async def test_prefill_follows_a_failover_and_the_receipt_names_the_engine_that_answered() -> None:
    busy = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy"

    async def script(conn: Any) -> None:
        while await conn.read_request() is not None:
            await conn.send(busy)

    index = EventIndex(BS)
    policy = kv_policy(index, builtin_tokenizer())
    async with (
        raw_engine(script) as engine,
        routed(sim("alive"), extra_urls=[engine.url, "http://127.0.0.1:9"], policy=policy) as setup,
    ):
        alive = setup.engine_ids[0]
        for question in QUESTIONS:
            status, _, headers = await setup.post(CHAT, ask(question))
            assert (status, headers["x-headcount-engine"]) == (200, alive)
        assert prefill_queued(setup) == [0, 0, 0]
        await wait_until(setup.all_released)
