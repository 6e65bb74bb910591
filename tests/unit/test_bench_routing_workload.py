"""The routing benchmark's workload is the same for every target, and shaped as documented."""

from __future__ import annotations

import json

from bench.routing.workload import WorkloadShape, arrivals, tenant_prompts

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
