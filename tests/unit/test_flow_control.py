"""Flow control: engines with room first, then a fair turn in the queue, else a clear refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from headcount._http.handler import Request
from headcount.auth.tenants import Tenant
from headcount.config import FlowSettings
from headcount.fleet import Engine, Fleet
from headcount.fleet.capacity import Capacity
from headcount.flow.control import FlowControl
from headcount.flow.limits import Charge, StoreHealth, Verdict
from headcount.flow.tally import TenantCounts
from headcount.flow.ticket import Decision, Refusal, Ticket
from headcount.sim.cluster.polling import wait_until
from tests.support.builders import MODEL, ready_fleet, spec

__all__: list[str] = []


class _Unlimited:
    """A store for tenants without rate limits: flow control must never ask it."""

    health = StoreHealth("memory", True, None, 0)

    def take(self, charge: Charge) -> Verdict:
        raise AssertionError(f"asked to judge {charge}")

    def settle(self, tenant: str, window: int, tokens: int) -> None:
        raise AssertionError("asked to settle")

    async def close(self) -> None:
        return None


def _fleet(*capacities: int | None) -> Fleet:
    fleet = ready_fleet(*(spec(f"e{n}") for n in range(len(capacities))))
    for engine, capacity in zip(fleet.snapshot.engines, capacities, strict=True):
        engine.load.concurrency = Capacity(capacity)
    return fleet


class _First:
    """A routing policy that picks the first engine with room."""

    def select(self, engines: Sequence[Engine], features: object) -> Engine | None:
        return engines[0] if engines else None


CHAT = Tenant("chat", priority=10)
BATCH = Tenant("batch")
SHED = Tenant("shed", priority=-1)


def _control(fleet: Fleet, **settings: float) -> FlowControl:
    flow = FlowSettings(**settings)  # type: ignore[arg-type]
    return FlowControl(fleet, flow, _Unlimited())


def _ticket(control: FlowControl, tenant: Tenant) -> Ticket:
    request = Request(b"POST", b"/v1/completions", [], b"", True, True)
    return Ticket(control, tenant, request, MODEL, {"max_tokens": 100})


def _admit(control: FlowControl, fleet: Fleet, tenant: Tenant) -> Decision:
    return control.admit(_ticket(control, tenant), fleet.snapshot.candidates(MODEL), _First(), None)


def _queued(control: FlowControl, fleet: Fleet, tenant: Tenant) -> asyncio.Future[Ticket | Refusal]:
    """A request of `tenant` admitted into the queue: its answer to come."""
    decided = _admit(control, fleet, tenant)
    assert not isinstance(decided, (Ticket, Refusal)), decided
    return asyncio.ensure_future(decided)


def _granted(fleet: Fleet, engine_id: str) -> int:
    return fleet.snapshot.by_id[engine_id].load.granted


def _counts(control: FlowControl) -> TenantCounts:
    return control.tallies.counts(frozenset({"chat", "batch", "shed", "capped", "late"}))


async def test_engines_without_a_learned_capacity_always_have_room() -> None:
    fleet = _fleet(None)
    control = _control(fleet)
    grants = [_admit(control, fleet, BATCH) for _ in range(50)]
    assert all(isinstance(grant, Ticket) for grant in grants)
    assert all(grant.body is None for grant in grants if isinstance(grant, Ticket)), (
        "a granted ticket holds no parsed body for the rest of its request"
    )
    assert _granted(fleet, "e0") == 50
    counts = _counts(control)
    assert counts.requests == {("batch", "admitted"): 50}
    assert counts.waits[("batch",)][0][0] == 50 and counts.waits[("batch",)][1] == 0.0


async def test_a_full_engine_queues_and_the_next_slot_goes_to_the_higher_priority() -> None:
    fleet = _fleet(1)
    control = _control(fleet)
    first = _admit(control, fleet, BATCH)
    assert isinstance(first, Ticket)
    batch = _queued(control, fleet, BATCH)
    chat = _queued(control, fleet, CHAT)
    await asyncio.sleep(0)
    assert control.queued == 2 and control.depths() == {0: 1, 10: 1}
    first.done(10, 20)
    await wait_until(chat.done, timeout=5, interval=0.001)
    assert not batch.done()
    granted = chat.result()
    assert isinstance(granted, Ticket) and granted.engine.id == "e0"
    assert _counts(control).tokens == {("batch", "prompt"): 10, ("batch", "completion"): 20}
    granted.done()
    assert isinstance(await asyncio.wait_for(batch, 5), Ticket)
    assert control.queued == 0


async def test_sheddable_requests_are_refused_when_no_engine_has_room_and_never_wait() -> None:
    fleet = _fleet(1)
    control = _control(fleet)
    assert isinstance(_admit(control, fleet, SHED), Ticket)  # room: served
    refused = _admit(control, fleet, SHED)
    assert isinstance(refused, Refusal) and refused.outcome == "shed"
    assert refused.retry_after >= 1
    assert control.queued == 0
    assert _counts(control).requests[("shed", "shed")] == 1


async def test_the_queue_is_bounded() -> None:
    fleet = _fleet(1)
    control = _control(fleet, max_queued=2)
    assert isinstance(_admit(control, fleet, BATCH), Ticket)
    waiting = [_queued(control, fleet, BATCH) for _ in range(2)]
    await asyncio.sleep(0)
    refused = _admit(control, fleet, CHAT)
    assert isinstance(refused, Refusal) and refused.outcome == "queue_full"
    for task in waiting:
        task.cancel()


async def test_a_request_waits_at_most_the_queue_timeout() -> None:
    fleet = _fleet(1)
    control = _control(fleet, queue_timeout=0.05)
    assert isinstance(_admit(control, fleet, BATCH), Ticket)
    refused = await asyncio.wait_for(_queued(control, fleet, CHAT), 5)
    assert isinstance(refused, Refusal) and refused.outcome == "queue_timeout"
    assert control.queued == 0 and _counts(control).requests[("chat", "queue_timeout")] == 1


async def test_a_client_that_leaves_the_queue_frees_its_place_and_its_concurrency() -> None:
    fleet = _fleet(1)
    capped = Tenant("capped", max_concurrency=2)
    control = _control(fleet)
    first = _admit(control, fleet, capped)
    assert isinstance(first, Ticket)
    waiting = _queued(control, fleet, capped)
    await asyncio.sleep(0)
    over = _admit(control, fleet, capped)
    assert isinstance(over, Refusal) and over.outcome == "concurrency_limited"
    waiting.cancel()
    await wait_until(lambda: control.queued == 0, timeout=5, interval=0.001)
    assert _counts(control).requests[("capped", "client_left")] == 1
    first.done()
    assert _granted(fleet, "e0") == 0
    assert isinstance(_admit(control, fleet, capped), Ticket)


async def test_a_grant_the_client_could_not_use_is_given_back() -> None:
    fleet = _fleet(1)
    control = _control(fleet)
    first = _admit(control, fleet, BATCH)
    assert isinstance(first, Ticket)
    waiting = _queued(control, fleet, BATCH)
    await asyncio.sleep(0)
    first.done()
    await asyncio.sleep(0)  # the dispatch grants it; the waiting task has not run since
    assert _granted(fleet, "e0") == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert _granted(fleet, "e0") == 0 and control.queued == 0


async def test_a_client_that_left_just_before_its_turn_is_skipped() -> None:
    fleet = _fleet(1)
    control = _control(fleet)
    first = _admit(control, fleet, BATCH)
    assert isinstance(first, Ticket)
    left = _queued(control, fleet, BATCH)
    stays = _queued(control, fleet, Tenant("late"))
    await asyncio.sleep(0)
    first.done()
    left.cancel()  # before the dispatch this slot scheduled
    granted = await asyncio.wait_for(stays, 5)
    assert isinstance(granted, Ticket) and granted.tenant.name == "late"
    assert control.queued == 0 and _counts(control).requests[("batch", "client_left")] == 1


async def test_batch_tenants_share_engine_slots_by_weight() -> None:
    fleet = _fleet(1)
    light, heavy = Tenant("light", weight=1), Tenant("heavy", weight=2)
    control = _control(fleet)
    running = _admit(control, fleet, light)
    assert isinstance(running, Ticket)
    tasks = [_queued(control, fleet, tenant) for _ in range(30) for tenant in (light, heavy)]
    served: list[str] = []
    seen: set[int] = set()
    for _ in range(30):
        running.done()
        await wait_until(
            lambda: sum(task.done() for task in tasks) > len(seen), timeout=5, interval=0.001
        )
        done = next(t for t in tasks if t.done() and id(t) not in seen)
        seen.add(id(done))
        running = done.result()
        assert isinstance(running, Ticket)
        served.append(running.tenant.name)
    for task in tasks:
        task.cancel()
    assert (served.count("light"), served.count("heavy")) == (10, 20)


async def test_failover_moves_the_slot_to_the_new_engine() -> None:
    fleet = _fleet(1, 1)
    control = _control(fleet)
    grant = _admit(control, fleet, BATCH)
    assert isinstance(grant, Ticket) and grant.engine.id == "e0"
    grant.moved(fleet.snapshot.engines[1])
    assert (_granted(fleet, "e0"), _granted(fleet, "e1")) == (0, 1)
    grant.done()
    grant.done()
    assert _granted(fleet, "e1") == 0


async def test_a_policy_that_picks_none_is_asked_once_and_its_request_refused() -> None:
    fleet = _fleet(None)
    control = _control(fleet)
    asked: list[int] = []

    class PicksNone:
        def select(self, engines: Sequence[Engine], features: object) -> Engine | None:
            asked.append(len(engines))
            return None

    candidates = fleet.snapshot.candidates(MODEL)
    refused = control.admit(_ticket(control, BATCH), candidates, PicksNone(), None)
    assert isinstance(refused, Refusal) and refused.outcome == "no_engine"
    assert asked == [1] and _granted(fleet, "e0") == 0
    assert _counts(control).requests == {("batch", "admitted"): 0, ("batch", "no_engine"): 1}
