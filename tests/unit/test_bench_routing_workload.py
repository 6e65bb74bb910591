"""The routing benchmark's workload is the same for every target, and shaped as documented."""

from __future__ import annotations

import json

import pytest

from bench.routing.fleet import BLOCK_SIZE, ENGINES, KV_BLOCKS
from bench.routing.workload import (
    WORKLOADS,
    WorkloadShape,
    arrivals,
    tenant_prompts,
    tenant_weights,
)
from headcount.tokens import builtin_tokenizer
from headcount.tokens.requests import chat_prompt_ids

SHAPE = WorkloadShape(tenants=4, system_words=50, max_turns=3)


def _messages(body: bytes) -> list[dict[str, str]]:
    return list(json.loads(body)["messages"])


def test_the_same_seed_and_rate_give_byte_identical_requests_at_identical_times() -> None:
    first = arrivals(SHAPE, "m", 5.0, 30.0)
    again = arrivals(SHAPE, "m", 5.0, 30.0)
    assert [(a.at_s, a.body) for a in first] == [(a.at_s, a.body) for a in again]
    assert [a.body for a in arrivals(WorkloadShape(seed=10), "m", 5.0, 30.0)] != [
        a.body for a in arrivals(WorkloadShape(seed=9), "m", 5.0, 30.0)
    ]


def test_arrivals_are_ordered_inside_the_run_at_about_the_asked_rate() -> None:
    schedule = arrivals(SHAPE, "m", 20.0, 50.0)
    times = [a.at_s for a in schedule]
    assert times == sorted(times)
    assert times[0] > 0 and times[-1] < 50.0
    assert 800 < len(schedule) < 1200


def test_every_request_starts_with_its_tenants_system_prompt() -> None:
    systems = tenant_prompts(SHAPE)
    for arrival in arrivals(SHAPE, "m", 10.0, 20.0):
        assert _messages(arrival.body)[0] == {"role": "system", "content": systems[arrival.tenant]}


def test_a_chat_turn_extends_an_earlier_prompt_of_the_same_tenant_and_chats_end() -> None:
    schedule = arrivals(SHAPE, "m", 10.0, 60.0)
    earlier: list[list[dict[str, str]]] = []
    turns = [a.turn for a in schedule]
    for arrival in schedule:
        messages = _messages(arrival.body)
        if arrival.turn > 1:
            assert messages[:-2] in earlier
            assert [m["role"] for m in messages[-2:]] == ["assistant", "user"]
        earlier.append(messages)
    assert max(turns) == SHAPE.max_turns
    assert 0.15 < sum(t > 1 for t in turns) / len(turns) < 0.45


def test_zipf_popularity_draws_tenant_t_with_weight_one_over_t_plus_one_to_the_power() -> None:
    shape = WorkloadShape(tenants=5, system_words=10, zipf=1.2, chat_share=0.0)
    schedule = arrivals(shape, "m", 100.0, 60.0)
    shares = [sum(a.tenant == t for a in schedule) / len(schedule) for t in range(5)]
    expected = tenant_weights(shape)
    assert expected[0] / expected[1] == pytest.approx(2**1.2)
    assert shares == pytest.approx(expected, abs=0.02)
    assert shares[0] > 2 * shares[1] > 0


def test_zipf_zero_is_the_uniform_draw_of_the_original_workload() -> None:
    schedule = arrivals(WorkloadShape(tenants=4, zipf=0.0), "m", 100.0, 30.0)
    shares = [sum(a.tenant == t for a in schedule) / len(schedule) for t in range(4)]
    assert shares == pytest.approx([0.25] * 4, abs=0.03)


def test_the_pressure_workloads_system_prompts_are_two_and_a_half_times_the_fleets_cache() -> None:
    shape = WORKLOADS["pressure"].shape
    cache_tokens = ENGINES * KV_BLOCKS * BLOCK_SIZE
    tokenizer = builtin_tokenizer()
    system_tokens = [
        len(chat_prompt_ids({"messages": [{"role": "system", "content": prompt}]}, tokenizer))
        for prompt in tenant_prompts(shape)
    ]
    assert sum(system_tokens) / cache_tokens == pytest.approx(2.5, abs=0.01)
    fitting = WORKLOADS["fitting"].shape
    assert fitting.tenants * (fitting.system_words + 16) < cache_tokens


def test_each_arrival_knows_its_question_number_and_the_question_that_opened_its_chat() -> None:
    schedule = arrivals(SHAPE, "m", 10.0, 60.0)
    by_number = {a.number: a for a in schedule}
    assert sorted(by_number) == list(range(1, len(schedule) + 1))
    for arrival in schedule:
        assert _messages(arrival.body)[-1]["content"].startswith(f"Question {arrival.number}:")
        opener = by_number[arrival.conversation]
        assert opener.turn == 1 and opener.tenant == arrival.tenant
        assert (arrival.conversation == arrival.number) == (arrival.turn == 1)
