"""A run's trace: the answers say which engine served each request and what it found cached,
and the cache model replays the requests' blocks exactly as the simulator keeps them."""

from __future__ import annotations

import dataclasses

from bench.routing.cache_model import lru_hits
from bench.routing.loadgen import Outcome, run_open_loop
from bench.routing.trace import run_trace, schedule_accesses
from bench.routing.workload import Arrival, WorkloadShape, arrivals
from headcount.sim.engine.config import EngineSimConfig
from headcount.sim.engine.server import running_engine

SHAPE = WorkloadShape(tenants=3, system_words=120, zipf=1.0, max_tokens=24)
BLOCKS = 40
"""39 usable blocks: three 8-block system prompts, their chats and the answers' blocks
overflow it, so the replay evicts."""


async def test_sequential_answers_report_their_engine_and_the_model_predicts_every_hit() -> None:
    schedule = arrivals(SHAPE, "sim-model", 20.0, 4.0)
    trace_of = schedule_accesses(schedule, 1.0, 16, SHAPE.max_tokens)
    config = EngineSimConfig(name="engine-x", kv_blocks=BLOCKS, prefill_tokens_per_s=1e9)
    outcomes: list[Outcome] = []
    async with running_engine(config) as engine:
        for arrival in schedule:
            alone: list[Arrival] = [dataclasses.replace(arrival, at_s=0.0)]
            outcomes += await run_open_loop(engine.url, alone, 10.0)
    trace = run_trace(trace_of, outcomes, ["engine-0", "engine-x"])
    assert trace.engines == (1,) * len(schedule)
    assert trace.mismatches == 0
    predicted = [16 * hits for hits in lru_hits(trace_of.accesses, BLOCKS - 1)]
    assert list(trace.cached_tokens) == predicted
    assert 0 < sum(predicted) < sum(trace_of.prompt_tokens)
    evicted = [
        index
        for index, access in enumerate(trace_of.accesses)
        if any(access.blocks[0] in earlier.blocks for earlier in trace_of.accesses[:index])
        and predicted[index] == 0
    ]
    assert evicted, "no request lost its prefix to eviction: the test would not see LRU order"


def test_a_failed_or_unknown_answer_has_no_engine_in_the_trace() -> None:
    schedule = arrivals(SHAPE, "sim-model", 20.0, 0.3)[:3]
    trace_of = schedule_accesses(schedule, 0.0, 16, SHAPE.max_tokens)
    tokens = trace_of.prompt_tokens
    outcomes = [
        Outcome(schedule[0], 0.0, 0.1, 0.2, 24, None, "engine-2", tokens[0], 16),
        Outcome(schedule[1], 0.0, None, None, 0, "status 503", "engine-1"),
        Outcome(schedule[2], 0.0, 0.1, 0.2, 24, None, "elsewhere", tokens[2] + 1, 0),
    ]
    trace = run_trace(trace_of, outcomes, ["engine-1", "engine-2"])
    assert trace.engines == (1, None, None)
    assert trace.cached_tokens == (16, None, None)
    assert trace.mismatches == 0


def test_requests_sharing_a_system_prompt_share_its_blocks_and_chat_turns_extend_theirs() -> None:
    schedule = arrivals(SHAPE, "sim-model", 20.0, 5.0)
    accesses = schedule_accesses(schedule, 0.0, 16, SHAPE.max_tokens).accesses
    first = {a.tenant: accesses[i] for i, a in reversed(list(enumerate(schedule)))}
    by_number = {a.number: i for i, a in enumerate(schedule)}
    for index, arrival in enumerate(schedule):
        assert accesses[index].blocks[:7] == first[arrival.tenant].blocks[:7]
        if arrival.turn > 1:
            opener = accesses[by_number[arrival.conversation]]
            assert accesses[index].blocks[: len(opener.blocks)] == opener.blocks
    tenants = {a.tenant for a in schedule}
    assert len({first[t].blocks[0] for t in tenants}) == len(tenants)
