"""Proves the simulated prefix cache keeps its blocks as vLLM's block pool does, without I/O.

Blocks, hits, LRU eviction, blocks filled by generated tokens, duplicates,
resets and the events a KV publisher receives are checked against a
recording sink; the prefill pipeline's first-come-first-served timing against
a fake clock; the scheduler's hand-back of a request cancelled as it starts.
"""

from __future__ import annotations

import asyncio
import hashlib
import pickle
from collections.abc import Sequence

import pytest

from headcount.sim.engine.kv_cache import KvCache, KvSequence
from headcount.sim.engine.prefill import PrefillPipeline
from headcount.sim.engine.scheduler import Scheduler
from tests.support import FakeClock, wait_until
from tests.support.kv_event_index import KvEventRecorder

BS = 4


def vllm_hashes(tokens: Sequence[int], lora: str | None = None) -> list[int]:
    """vLLM's sha256 block hashes (wire form), computed here from its formula."""
    protocol = pickle.HIGHEST_PROTOCOL
    parent = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=protocol)).digest()
    extra = (lora,) if lora else None
    hashes = []
    for start in range(0, len(tokens) - BS + 1, BS):
        key = (parent, tuple(tokens[start : start + BS]), extra)
        parent = hashlib.sha256(pickle.dumps(key, protocol=protocol)).digest()
        hashes.append(int.from_bytes(parent, "big") & (2**64 - 1))
    return hashes


def cache(blocks: int = 17) -> tuple[KvCache, KvEventRecorder]:
    sink = KvEventRecorder()
    return KvCache(blocks, BS, sink), sink


def seq(
    kv: KvCache, prompt: Sequence[int], outputs: int = 1, lora: str | None = None
) -> KvSequence:
    return kv.sequence(list(prompt), [900 + i for i in range(outputs)], lora)


def run(kv: KvCache, prompt: Sequence[int], outputs: int = 1, lora: str | None = None) -> int:
    """Admit, generate and finish a request; the tokens it found cached."""
    request = seq(kv, prompt, outputs, lora)
    assert kv.admit(request)
    for generated in range(1, outputs + 1):
        kv.advance(request, generated)
    kv.release(request)
    return request.cached_tokens


def test_full_prompt_blocks_are_stored_at_admission_with_vllm_hashes() -> None:
    kv, sink = cache()
    prompt = list(range(10))  # two full blocks and a partial one
    request = seq(kv, prompt)
    assert kv.admit(request)
    assert sink.take() == [("stored", vllm_hashes(prompt), None, prompt[:8], BS, None)]
    assert (kv.queries, kv.hits) == (10, 0)


def test_the_hit_is_the_longest_cached_run_capped_below_the_prompt_length() -> None:
    kv, _ = cache()
    assert run(kv, range(8)) == 0
    assert run(kv, range(8)) == 4  # vLLM recomputes the last token: 7 tokens, one block
    assert run(kv, range(9)) == 8
    assert run(kv, [*range(4), 99, 98, 97, 96, 8]) == 4  # diverges in the second block
    assert (kv.queries, kv.hits) == (8 + 8 + 9 + 9, 0 + 4 + 8 + 4)


def test_a_block_is_its_tokens_chained_with_its_parents_and_the_adapter() -> None:
    kv, _ = cache()
    run(kv, [1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert run(kv, [9, 9, 9, 9, 5, 6, 7, 8, 0]) == 0  # same second block, other parent
    assert run(kv, [1, 2, 3, 4, 5, 6, 7, 8, 0], lora="sql-lora") == 0
    assert run(kv, [1, 2, 3, 4, 5, 6, 7, 8, 0], lora="sql-lora") == 8


def test_blocks_filled_by_generated_tokens_are_cached_as_they_fill() -> None:
    kv, sink = cache()
    request = seq(kv, range(6), outputs=8)
    assert kv.admit(request)
    sink.take()
    kv.advance(request, 2)  # KV of 6 + 1 tokens: block 1 not full yet
    assert sink.take() == []
    kv.advance(request, 3)  # 8 tokens computed: block 1 = 4, 5, 900, 901
    all_tokens = [*range(6), *range(900, 908)]
    hashes = vllm_hashes(all_tokens)
    assert sink.take() == [("stored", [hashes[1]], hashes[0], [4, 5, 900, 901], BS, None)]
    kv.advance(request, 8)  # 13 tokens computed: block 2 full, the last token never is
    assert sink.take() == [("stored", [hashes[2]], hashes[1], [902, 903, 904, 905], BS, None)]
    kv.release(request)
    assert run(kv, [*range(6), 900, 901, 902, 903, 904, 905, 906]) == 12


def test_eviction_takes_unused_blocks_least_recently_freed_and_tail_first() -> None:
    kv, sink = cache(blocks=7)  # six usable blocks
    first, second = list(range(12)), list(range(100, 112))
    run(kv, first)  # blocks f0 f1 f2 cached, freed tail first
    run(kv, second)  # three untouched blocks: no eviction yet
    assert not [e for e in sink.take() if e[0] == "removed"]
    third = list(range(200, 208))
    run(kv, third)  # two blocks: evicts f2 then f1
    f = vllm_hashes(first)
    assert [e for e in sink.take() if e[0] == "removed"] == [
        ("removed", [f[2]]),
        ("removed", [f[1]]),
    ]
    held = {block["hash"] for block in kv.view()["blocks"]}
    assert held == {f[0], *vllm_hashes(second), *vllm_hashes(third)}


def test_admission_takes_the_prompts_blocks_and_tokens_take_theirs_as_they_need_them() -> None:
    kv, _ = cache(blocks=5)  # four usable blocks
    holder = seq(kv, range(8), outputs=5)  # 8 + 4 tokens computed in the end: three blocks
    assert kv.admit(holder) and kv.pool.free_count == 2  # its prompt's two, nothing reserved
    other = seq(kv, range(50, 58))
    assert kv.admit(other) and kv.pool.free_count == 0
    assert kv.advance(holder, 1)  # 8 tokens computed: no block needed
    assert not kv.advance(holder, 2)  # the 9th needs one and none is free: preempt someone
    assert (holder.generated, len(holder.blocks)) == (1, 2)  # nothing changed
    assert not kv.admit(seq(kv, range(100, 104)))
    assert (kv.queries, kv.hits) == (16, 0)  # a request not admitted is not counted
    kv.release(other)
    assert kv.advance(holder, 2) and kv.pool.free_count == 1
    assert not kv.fits_ever(seq(kv, range(16), outputs=2))


def test_a_preempted_request_admitted_again_takes_blocks_for_its_tokens_and_counts_no_hit() -> None:
    kv, _ = cache()
    request = seq(kv, range(6), outputs=8)
    assert kv.admit(request)
    for generated in range(1, 5):
        assert kv.advance(request, generated)  # 9 tokens computed: three blocks, two full
    kv.release(request)  # preempted
    assert len(kv.hit(request)) == 2  # its full blocks, cached, up to its 10 tokens less one
    assert kv.admit(request) and len(request.blocks) == 3
    assert (kv.queries, kv.hits, request.cached_tokens) == (6, 0, 0)  # as at its first admission


def test_usage_counts_the_blocks_requests_hold_not_the_cached_ones() -> None:
    kv, _ = cache(blocks=11)  # ten usable
    request = seq(kv, range(10), outputs=3)
    assert kv.admit(request)
    assert kv.pool.usage == pytest.approx(3 / 10)
    kv.release(request)
    assert kv.pool.usage == 0.0
    assert len(kv.view()["blocks"]) == 2


def test_the_same_block_computed_twice_is_stored_and_removed_per_copy() -> None:
    kv, sink = cache(blocks=5)
    prompt = list(range(8))
    run(kv, prompt)  # blocks b0 b1
    again = seq(kv, prompt)  # hits b0 only (cap), computes b1 again
    assert kv.admit(again)
    b = vllm_hashes(prompt)
    assert sink.events()[-1] == ("stored", [b[1]], b[0], prompt[4:], BS, None)
    kv.release(again)
    sink.take()
    run(kv, list(range(50, 62)))  # three of four blocks: evicts through both copies of b1
    assert sink.take().count(("removed", [b[1]])) == 2


def test_one_admission_is_one_batch_evictions_first() -> None:
    kv, sink = cache(blocks=3)  # two usable
    run(kv, range(8))
    sink.take()
    run(kv, range(10, 18))
    (batch, *_) = sink.batches
    assert [event[0] for event in batch] == ["removed", "removed", "stored"]


def test_reset_clears_with_an_event_only_when_no_block_is_held() -> None:
    kv, sink = cache()
    request = seq(kv, range(8), outputs=4)
    assert kv.admit(request)
    sink.take()
    assert not kv.clear(announce=True)
    assert sink.take() == []
    kv.release(request)
    assert kv.clear(announce=True)
    assert sink.batches == [[("cleared",)]]
    assert run(kv, range(8)) == 0


def test_a_restart_forgets_the_cache_silently_even_while_blocks_are_held() -> None:
    kv, sink = cache()
    run(kv, range(8))
    holder = seq(kv, range(20, 28), outputs=6)
    assert kv.admit(holder)
    sink.take()
    assert kv.clear(announce=False)
    assert sink.take() == []
    kv.advance(holder, 6)  # blocks it fills still chain to its own earlier ones
    (event,) = sink.take()
    assert event[2] == vllm_hashes(range(20, 28))[1]
    kv.release(holder)
    assert run(kv, range(8)) == 0


def test_prefill_is_first_come_first_served_so_a_long_prompt_delays_the_next() -> None:
    clock = FakeClock(0.0)
    pipeline = PrefillPipeline(1000.0, clock)
    assert pipeline.admit(2000) == (0.0, 2.0)
    clock.now = 0.5
    assert pipeline.admit(10) == (2.0, 2.01)  # waits for the long one
    assert pipeline.backlog() == pytest.approx(1.51)
    clock.now = 3.0
    assert pipeline.admit(10) == (3.0, 3.01)
    assert pipeline.backlog() == pytest.approx(0.01)


class Ticket:
    """A request for the scheduler that needs nothing besides a slot."""

    def __init__(self) -> None:
        self.released = 0

    def admit(self) -> bool:
        return True

    def release(self) -> None:
        self.released += 1


async def test_a_request_cancelled_as_it_is_admitted_gives_back_what_it_took() -> None:
    scheduler: Scheduler[Ticket] = Scheduler(max_running=1)
    first, second = Ticket(), Ticket()

    async def hold(ticket: Ticket) -> None:
        async with scheduler.slot(ticket):
            await asyncio.Event().wait()

    async with scheduler.slot(first):
        waiting = asyncio.create_task(hold(second))
        await wait_until(lambda: len(scheduler.waiting) == 1)
    waiting.cancel()  # admitted when `first` left, cancelled before it ran
    await asyncio.gather(waiting, return_exceptions=True)
    assert (scheduler.running, second.released) == ({}, 1)


async def test_preemption_takes_the_request_scheduled_last_to_the_head_of_the_queue() -> None:
    scheduler: Scheduler[Ticket] = Scheduler(max_running=3)
    first, second, third, late = Ticket(), Ticket(), Ticket(), Ticket()
    resumed: list[bool] = []

    async def hold(ticket: Ticket) -> None:
        async with scheduler.slot(ticket):
            resumed.append(await scheduler.resumed(ticket))
            await asyncio.Event().wait()

    tasks = [asyncio.create_task(hold(ticket)) for ticket in (first, second, third)]
    await wait_until(lambda: len(resumed) == 3)
    assert scheduler.preempt_newest() is third and third.released == 1
    tasks.append(asyncio.create_task(hold(late)))
    await wait_until(lambda: len(scheduler.waiting) == 2)
    assert (list(scheduler.running), scheduler.waiting) == ([first, second], [third, late])
    assert scheduler.preemptions == 1
    tasks[1].cancel()  # the queue wakes: the preempted one, first in line, first
    await wait_until(lambda: scheduler.waiting == [])
    assert list(scheduler.running) == [first, third, late]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert (scheduler.running, scheduler.waiting) == ({}, [])


async def test_a_preempted_request_whose_client_leaves_leaves_the_queue() -> None:
    scheduler: Scheduler[Ticket] = Scheduler(max_running=1)
    first, second = Ticket(), Ticket()
    started = asyncio.Event()

    async def hold(ticket: Ticket) -> None:
        async with scheduler.slot(ticket):
            started.set()
            await scheduler.resumed(ticket)
            await asyncio.Event().wait()

    task = asyncio.create_task(hold(first))
    await started.wait()
    assert scheduler.preempt_newest() is first
    waiter = asyncio.create_task(hold(second))
    await wait_until(lambda: scheduler.waiting == [first, second])
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await wait_until(lambda: list(scheduler.running) == [second])  # its turn passed on
    assert scheduler.waiting == [] and first.released == 2
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
