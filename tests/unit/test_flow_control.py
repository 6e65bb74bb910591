"""Flow control: engines with room first, then a fair turn in the queue, else a clear refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

import pytest

from headcount.auth.tenants import Tenant
from headcount.config import FlowSettings
from headcount.fleet import Engine, Fleet
from headcount.fleet.capacity import Capacity
from headcount.flow.control import FlowControl
from headcount.flow.limits import Charge, StoreHealth, Verdict
from headcount.flow.ticket import Ask, Grant, Refusal
from headcount.sim.cluster.polling import wait_until
from tests.support.builders import MODEL, ready_fleet, spec

__all__: list[str] = []


class _Recorded:
    """`FlowMetrics` that keeps what it heard."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str]] = []
        self.queued: list[tuple[str, float]] = []
        self.tokens: list[tuple[str, int, int]] = []

    def tenant_request(self, tenant: Tenant, outcome: str) -> None:
        self.outcomes.append((tenant.name, outcome))

    def tenant_admitted(self, tenant: Tenant, waited: float) -> None:
        self.outcomes.append((tenant.name, "admitted"))
        self.queued.append((tenant.name, waited))

    def tenant_tokens(self, tenant: Tenant, prompt: int, completion: int) -> None:
        self.tokens.append((tenant.name, prompt, completion))


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


def _first(room: Sequence[Engine]) -> Engine | None:
    return room[0] if room else None


CHAT = Tenant("chat", priority=10)
BATCH = Tenant("batch")
SHED = Tenant("shed", priority=-1)


def _ask(tenant: Tenant, tokens: int = 100, flow: str = "") -> Ask:
    return Ask(tenant, tenant.priority, flow, MODEL, tokens)


def _control(
    fleet: Fleet, metrics: _Recorded | None = None, **settings: float
) -> tuple[FlowControl, _Recorded]:
    metrics = metrics or _Recorded()
    flow = FlowSettings(**settings)  # type: ignore[arg-type]
    return FlowControl(fleet, flow, _Unlimited(), metrics), metrics


def _admit(
    control: FlowControl, fleet: Fleet, ask: Ask
) -> Grant | Refusal | Awaitable[Grant | Refusal]:
    return control.admit(ask, fleet.snapshot.candidates(MODEL), _first)


def _queued(control: FlowControl, fleet: Fleet, ask: Ask) -> asyncio.Future[Grant | Refusal]:
    """`ask` admitted into the queue: its answer to come."""
    decided = _admit(control, fleet, ask)
    assert not isinstance(decided, (Grant, Refusal)), decided
    return asyncio.ensure_future(decided)


async def test_engines_without_a_learned_capacity_always_have_room() -> None:
    fleet = _fleet(None)
    control, metrics = _control(fleet)
    grants = [_admit(control, fleet, _ask(BATCH)) for _ in range(50)]
    assert all(isinstance(grant, Grant) for grant in grants)
    assert control.busy("e0") == 50
    assert metrics.queued == [("batch", 0.0)] * 50


async def test_a_full_engine_queues_and_the_next_slot_goes_to_the_higher_priority() -> None:
    fleet = _fleet(1)
    control, metrics = _control(fleet)
    first = _admit(control, fleet, _ask(BATCH))
    assert isinstance(first, Grant)
    batch = _queued(control, fleet, _ask(BATCH))
    chat = _queued(control, fleet, _ask(CHAT))
    await asyncio.sleep(0)
    assert control.queued == 2 and control.depths() == {0: 1, 10: 1}
    first.ticket.done(10, 20)
    await wait_until(chat.done, timeout=5, interval=0.001)
    assert not batch.done()
    granted = chat.result()
    assert isinstance(granted, Grant) and granted.engine.id == "e0"
    assert metrics.tokens == [("batch", 10, 20)]
    granted.ticket.done()
    assert isinstance(await asyncio.wait_for(batch, 5), Grant)
    assert control.queued == 0


async def test_sheddable_requests_are_refused_when_no_engine_has_room_and_never_wait() -> None:
    fleet = _fleet(1)
    control, metrics = _control(fleet)
    assert isinstance(_admit(control, fleet, _ask(SHED)), Grant)  # room: served
    refused = _admit(control, fleet, _ask(SHED))
    assert isinstance(refused, Refusal) and refused.outcome == "shed"
    assert refused.retry_after >= 1
    assert control.queued == 0
    assert ("shed", "shed") in metrics.outcomes


async def test_the_queue_is_bounded() -> None:
    fleet = _fleet(1)
    control, _ = _control(fleet, max_queued=2)
    assert isinstance(_admit(control, fleet, _ask(BATCH)), Grant)
    waiting = [_queued(control, fleet, _ask(BATCH)) for _ in range(2)]
    await asyncio.sleep(0)
    refused = _admit(control, fleet, _ask(CHAT))
    assert isinstance(refused, Refusal) and refused.outcome == "queue_full"
    for task in waiting:
        task.cancel()


async def test_a_request_waits_at_most_the_queue_timeout() -> None:
    fleet = _fleet(1)
    control, metrics = _control(fleet, queue_timeout=0.05)
    assert isinstance(_admit(control, fleet, _ask(BATCH)), Grant)
    refused = await asyncio.wait_for(_queued(control, fleet, _ask(CHAT)), 5)
    assert isinstance(refused, Refusal) and refused.outcome == "queue_timeout"
    assert control.queued == 0 and ("chat", "queue_timeout") in metrics.outcomes


async def test_a_client_that_leaves_the_queue_frees_its_place_and_its_concurrency() -> None:
    fleet = _fleet(1)
    capped = Tenant("capped", max_concurrency=2)
    control, metrics = _control(fleet)
    first = _admit(control, fleet, _ask(capped))
    assert isinstance(first, Grant)
    waiting = _queued(control, fleet, _ask(capped))
    await asyncio.sleep(0)
    over = _admit(control, fleet, _ask(capped))
    assert isinstance(over, Refusal) and over.outcome == "concurrency_limited"
    waiting.cancel()
    await wait_until(lambda: control.queued == 0, timeout=5, interval=0.001)
    assert ("capped", "client_left") in metrics.outcomes
    first.ticket.done()
    assert control.busy("e0") == 0
    assert isinstance(_admit(control, fleet, _ask(capped)), Grant)


async def test_a_grant_the_client_could_not_use_is_given_back() -> None:
    fleet = _fleet(1)
    control, _ = _control(fleet)
    first = _admit(control, fleet, _ask(BATCH))
    assert isinstance(first, Grant)
    waiting = _queued(control, fleet, _ask(BATCH))
    await asyncio.sleep(0)
    first.ticket.done()
    await asyncio.sleep(0)  # the dispatch grants it; the waiting task has not run since
    assert control.busy("e0") == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert control.busy("e0") == 0 and control.queued == 0


async def test_a_client_that_left_just_before_its_turn_is_skipped() -> None:
    fleet = _fleet(1)
    control, metrics = _control(fleet)
    first = _admit(control, fleet, _ask(BATCH))
    assert isinstance(first, Grant)
    left = _queued(control, fleet, _ask(BATCH))
    stays = _queued(control, fleet, _ask(Tenant("late")))
    await asyncio.sleep(0)
    first.ticket.done()
    left.cancel()  # before the dispatch this slot scheduled
    granted = await asyncio.wait_for(stays, 5)
    assert isinstance(granted, Grant) and granted.ticket.tenant.name == "late"
    assert control.queued == 0 and ("batch", "client_left") in metrics.outcomes


async def test_batch_tenants_share_engine_slots_by_weight() -> None:
    fleet = _fleet(1)
    light, heavy = Tenant("light", weight=1), Tenant("heavy", weight=2)
    control, _ = _control(fleet)
    running = _admit(control, fleet, _ask(light))
    assert isinstance(running, Grant)
    tasks = [_queued(control, fleet, _ask(tenant)) for _ in range(30) for tenant in (light, heavy)]
    served: list[str] = []
    seen: set[int] = set()
    for _ in range(30):
        running.ticket.done()
        await wait_until(
            lambda: sum(task.done() for task in tasks) > len(seen), timeout=5, interval=0.001
        )
        done = next(t for t in tasks if t.done() and id(t) not in seen)
        seen.add(id(done))
        running = done.result()
        assert isinstance(running, Grant)
        served.append(running.ticket.tenant.name)
    for task in tasks:
        task.cancel()
    assert (served.count("light"), served.count("heavy")) == (10, 20)


async def test_failover_moves_the_slot_to_the_new_engine() -> None:
    fleet = _fleet(1, 1)
    control, _ = _control(fleet)
    grant = _admit(control, fleet, _ask(BATCH))
    assert isinstance(grant, Grant) and grant.engine.id == "e0"
    grant.ticket.moved("e1")
    assert (control.busy("e0"), control.busy("e1")) == (0, 1)
    grant.ticket.done()
    grant.ticket.done()
    assert control.busy("e1") == 0


async def test_a_policy_that_picks_none_is_asked_once_and_its_request_refused() -> None:
    fleet = _fleet(None)
    control, metrics = _control(fleet)
    asked: list[int] = []

    def none(room: Sequence[Engine]) -> Engine | None:
        asked.append(len(room))
        return None

    refused = control.admit(_ask(BATCH), fleet.snapshot.candidates(MODEL), none)
    assert isinstance(refused, Refusal) and refused.outcome == "no_engine"
    assert asked == [1] and control.busy("e0") == 0
    assert metrics.outcomes == [("batch", "no_engine")]
