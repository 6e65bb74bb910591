"""Flow control: every request of a tenant either goes to an engine with room, waits its turn
in the router, or is refused with what the client should do.

    control = FlowControl(fleet, settings.flow, store, metrics)
    decision = control.admit(ask, candidates, choose)   # Grant | Refusal | Awaitable of one
    ...
    grant.ticket.done(prompt_tokens, completion_tokens)  # the request's end, once

In order, a request is refused (429) when its tenant has `max_concurrency`
requests in flight already (`concurrency_limited`), when it is sheddable
(priority below 0) and no engine has room (`shed`), when the queue holds
`max_queued` requests (`queue_full`), and when its tenant's limits store says
no (`rate_limited`, with the store's `Retry-After`). Otherwise it goes at once
to an engine with room, through the routing policy (`choose`), if no request
of its model waits; else it waits in the `FairQueue` of its model, until an
engine has room (dispatched by priority, fair share and arrival) or
`queue_timeout` passes (503).

An engine has room while the requests this router has granted there are fewer
than its learned capacity (`fleet/capacity.py`): the router's own count, never
older than the last request's end, so a burst between two scrapes cannot
overfill it. Every granted request holds a `Ticket` until its end: its
tenant's concurrency, its engine's slot (moved on failover) and its token
reservation, settled on the usage the engine reports. A slot given back
dispatches the queue on the next turn of the loop; so does a change of the
fleet, and a tick every `_TICK` seconds while requests wait (a capacity the
prober raised frees no slot).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Protocol

from headcount.auth.tenants import Tenant
from headcount.config import FlowSettings
from headcount.fleet import Engine, Fleet, FleetChange
from headcount.flow.limits import Charge, LimitsStore, Verdict, ratelimit_headers
from headcount.flow.queue import FairQueue, QueueEntry
from headcount.flow.ticket import Ask, Choose, Grant, Refusal, Ticket

__all__ = ["FlowControl", "FlowMetrics"]

_TICK = 0.25
"""Seconds between dispatch attempts while requests wait and no slot is given back."""


class FlowMetrics(Protocol):
    """What flow control counts (`surfaces/metrics.py` implements it)."""

    def tenant_request(self, tenant: Tenant, outcome: str) -> None:
        """A request of `tenant` was not admitted: `outcome` says why."""

    def tenant_admitted(self, tenant: Tenant, waited: float) -> None:
        """A request of `tenant` was sent on to an engine after `waited` seconds in the queue."""

    def tenant_tokens(self, tenant: Tenant, prompt: int, completion: int) -> None: ...


class _Waiting:
    """A request in the queue: what it asked, how it picks, where its answer goes."""

    __slots__ = ("ask", "choose", "entry", "future", "since", "timer", "verdict")

    def __init__(
        self,
        ask: Ask,
        choose: Choose,
        verdict: Verdict | None,
        future: asyncio.Future[Grant | Refusal],
        since: float,
    ) -> None:
        self.ask = ask
        self.choose = choose
        self.verdict = verdict
        self.future = future
        self.since = since
        self.entry: QueueEntry[_Waiting] | None = None
        self.timer: asyncio.TimerHandle | None = None


class FlowControl:
    """The router's admission under load; see the module docstring."""

    def __init__(
        self,
        fleet: Fleet,
        settings: FlowSettings,
        store: LimitsStore,
        metrics: FlowMetrics,
    ) -> None:
        self._fleet = fleet
        self._settings = settings
        self.store = store
        self._metrics = metrics
        self._queues: dict[str, FairQueue[_Waiting]] = {}
        self._queued = 0
        self._busy: dict[str, int] = {}
        """Per engine id, the requests granted there and not ended."""
        self._active: dict[str, int] = {}
        """Per tenant, its requests queued or granted and not ended."""
        self._dispatch_soon: asyncio.Handle | None = None
        self._tick: asyncio.TimerHandle | None = None
        fleet.subscribe(self._on_fleet_change)

    async def close(self) -> None:
        """Stop dispatching (the proxy has closed every waiting request) and close the store."""
        for handle in (self._tick, self._dispatch_soon):
            if handle is not None:
                handle.cancel()
        self._tick = self._dispatch_soon = None
        await self.store.close()

    # -- what the surfaces read ---------------------------------------------------------------

    @property
    def queued(self) -> int:
        return self._queued

    def depths(self) -> dict[int, int]:
        """Requests waiting, per priority, every model's queue summed."""
        depths: dict[int, int] = {}
        for queue in self._queues.values():
            for priority, depth in queue.depths().items():
                depths[priority] = depths.get(priority, 0) + depth
        return depths

    def busy(self, engine_id: str) -> int:
        """Requests granted on `engine_id` and not ended."""
        return self._busy.get(engine_id, 0)

    # -- admission ----------------------------------------------------------------------------

    def admit(
        self, ask: Ask, candidates: Sequence[Engine], choose: Choose
    ) -> Grant | Refusal | Awaitable[Grant | Refusal]:
        """`ask`'s way in among `candidates` (not empty), `choose` picking among those with
        room; see the module docstring for the order of the checks."""
        tenant = ask.tenant
        name = tenant.name
        if tenant.max_concurrency and self._active.get(name, 0) >= tenant.max_concurrency:
            return self._refuse(
                ask,
                "concurrency_limited",
                f"tenant {name} has {tenant.max_concurrency} requests in flight, its "
                "max_concurrency; retry when one ends",
                1.0,
            )
        room = self._room(ask.model, candidates)
        if not room:
            refusal = self._cannot_wait(ask)
            if refusal is not None:
                return refusal
        if not (tenant.requests_per_minute or tenant.tokens_per_minute):
            return self._place(ask, room, choose, None)
        judged = self.store.take(
            Charge(name, tenant.requests_per_minute, tenant.tokens_per_minute, ask.tokens)
        )
        if isinstance(judged, Verdict):
            return self._judged(ask, room, choose, judged)
        return self._judged_later(ask, choose, judged)

    def _cannot_wait(self, ask: Ask) -> Refusal | None:
        """A refusal when the request, which must wait, may not: it is sheddable, or the
        queue is full."""
        if ask.priority < 0:
            return self._refuse(
                ask,
                "shed",
                f"every engine serving `{ask.model}` is busy and this request's priority "
                f"({ask.priority}) is sheddable; retry later",
                self._settings.queue_timeout / 10,
            )
        if self._queued >= self._settings.max_queued:
            return self._refuse(
                ask,
                "queue_full",
                f"{self._queued} requests wait for an engine already (--max-queued); retry later",
                self._settings.queue_timeout / 10,
            )
        return None

    async def _judged_later(
        self, ask: Ask, choose: Choose, judged: Awaitable[Verdict]
    ) -> Grant | Refusal:
        verdict = await judged
        candidates = self._fleet.snapshot.candidates(ask.model)
        if not candidates:
            self._give_back(ask, verdict)
            return self._refuse(ask, "no_engine", f"no engine serves `{ask.model}` now", 1.0)
        decision = self._judged(ask, self._room(ask.model, candidates), choose, verdict)
        if isinstance(decision, (Grant, Refusal)):
            return decision
        return await decision

    def _judged(
        self, ask: Ask, room: list[Engine], choose: Choose, verdict: Verdict
    ) -> Grant | Refusal | Awaitable[Grant | Refusal]:
        if verdict.allowed:
            return self._place(ask, room, choose, verdict)
        name = ask.tenant.name
        if verdict.reason == "tokens_over_limit":
            message = (
                f"this request reserves {ask.tokens} tokens, more than tenant {name}'s "
                f"tokens_per_minute ({ask.tenant.tokens_per_minute}); lower max_tokens"
            )
        else:
            message = f"tenant {name} is over its {verdict.reason.replace('_', ' ')}"
        return self._refuse(
            ask, "rate_limited", message, verdict.retry_after, ratelimit_headers(verdict)
        )

    def _place(
        self, ask: Ask, room: list[Engine], choose: Choose, verdict: Verdict | None
    ) -> Grant | Refusal | Awaitable[Grant | Refusal]:
        """Grant one of the engines with `room` now, or queue (a refusal if it may not)."""
        if room:
            engine = choose(room)
            if engine is None:
                return self._chose_none(ask, verdict)
            return self._grant(ask, engine, verdict, 0.0)
        refusal = self._cannot_wait(ask)
        if refusal is not None:
            self._give_back(ask, verdict)
            return refusal
        return self._enqueue(ask, choose, verdict)

    def _room(self, model: str, candidates: Sequence[Engine]) -> list[Engine]:
        """The engines a request for `model` may go to now: none while others wait for one
        (they go first), else the `candidates` with room."""
        queue = self._queues.get(model)
        if queue is not None and len(queue):
            return []
        return self._with_room(candidates)

    def _with_room(self, candidates: Sequence[Engine]) -> list[Engine]:
        return [engine for engine in candidates if self._has_room(engine)]

    def _has_room(self, engine: Engine) -> bool:
        capacity = engine.load.concurrency.value
        return capacity is None or self._busy.get(engine.id, 0) < capacity

    def _grant(self, ask: Ask, engine: Engine, verdict: Verdict | None, waited: float) -> Grant:
        tenant = ask.tenant
        if tenant.max_concurrency:
            self._active_add(tenant.name, 1)
        busy, engine_id = self._busy, engine.id
        busy[engine_id] = busy.get(engine_id, 0) + 1
        self._metrics.tenant_admitted(tenant, waited)
        return Grant(engine, Ticket(self, ask, engine.id, verdict))

    def _refuse(
        self, ask: Ask, outcome: str, message: str, retry_after: float, headers: bytes = b""
    ) -> Refusal:
        self._metrics.tenant_request(ask.tenant, outcome)
        return Refusal(outcome, message, max(retry_after, 1.0) if retry_after > 0 else 0.0, headers)

    def _chose_none(self, ask: Ask, verdict: Verdict | None) -> Refusal:
        """The routing policy picked none of the engines with room: refused, reservation back."""
        self._give_back(ask, verdict)
        return self._refuse(ask, "no_engine", "the routing policy chose no engine", 1.0)

    def _give_back(self, ask: Ask, verdict: Verdict | None) -> None:
        """A charged request was refused after all: its reserved tokens go back."""
        if verdict is not None and verdict.tokens is not None and ask.tokens:
            self.store.settle(ask.tenant.name, verdict.window, -ask.tokens)

    # -- the queue ----------------------------------------------------------------------------

    def _enqueue(
        self, ask: Ask, choose: Choose, verdict: Verdict | None
    ) -> Awaitable[Grant | Refusal]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Grant | Refusal] = loop.create_future()
        waiting = _Waiting(ask, choose, verdict, future, loop.time())
        queue = self._queues.get(ask.model)
        if queue is None:
            queue = self._queues[ask.model] = FairQueue()
        tenant = ask.tenant
        waiting.entry = queue.push(
            waiting,
            priority=ask.priority,
            tenant=tenant.name,
            weight=tenant.weight,
            flow=ask.flow,
            cost=ask.tokens,
        )
        self._queued += 1
        if tenant.max_concurrency:
            self._active_add(tenant.name, 1)
        waiting.timer = loop.call_later(self._settings.queue_timeout, self._expire, waiting)
        future.add_done_callback(lambda _: self._left(waiting))
        if self._tick is None:
            self._tick = loop.call_later(_TICK, self._on_tick)
        return self._wait(future)

    @staticmethod
    async def _wait(future: asyncio.Future[Grant | Refusal]) -> Grant | Refusal:
        """The queued request's answer. Its client may leave while waiting (the future is
        cancelled: it leaves the queue), or just after its grant, before it could use it:
        the grant is given back then."""
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                granted = future.result()
                if isinstance(granted, Grant):
                    granted.ticket.done(0, 0)
            raise

    def _unqueue(self, waiting: _Waiting) -> bool:
        """Take `waiting` out of its queue; False if it was out already."""
        entry = waiting.entry
        if entry is None:
            return False
        self._queues[waiting.ask.model].remove(entry)
        self._taken(waiting)
        return True

    def _taken(self, waiting: _Waiting) -> None:
        """`waiting` is out of its queue (removed or popped): counts and timer follow."""
        waiting.entry = None
        self._queued -= 1
        tenant = waiting.ask.tenant
        if tenant.max_concurrency:
            self._active_add(tenant.name, -1)
        timer = waiting.timer
        if timer is not None:
            waiting.timer = None
            timer.cancel()

    def _expire(self, waiting: _Waiting) -> None:
        waiting.timer = None
        if not self._unqueue(waiting):
            return
        self._give_back(waiting.ask, waiting.verdict)
        timeout = self._settings.queue_timeout
        waiting.future.set_result(
            self._refuse(
                waiting.ask,
                "queue_timeout",
                f"no engine serving `{waiting.ask.model}` had room within {timeout:g}s "
                "(--queue-timeout); retry later",
                timeout / 10,
            )
        )

    def _left(self, waiting: _Waiting) -> None:
        """The future is done: if cancelled (the client left), the request leaves the queue."""
        if waiting.future.cancelled() and self._unqueue(waiting):
            self._client_left(waiting)

    def _client_left(self, waiting: _Waiting) -> None:
        self._give_back(waiting.ask, waiting.verdict)
        self._metrics.tenant_request(waiting.ask.tenant, "client_left")

    def _soon(self) -> None:
        if self._queued and self._dispatch_soon is None:
            self._dispatch_soon = asyncio.get_running_loop().call_soon(self._dispatch)

    def _on_tick(self) -> None:
        self._tick = None
        self._dispatch()
        if self._queued:
            self._tick = asyncio.get_running_loop().call_later(_TICK, self._on_tick)

    def _on_fleet_change(self, _change: FleetChange) -> None:
        if self._queued:
            self._soon()

    def _dispatch(self) -> None:
        """Hand waiting requests to engines with room, best first, until none has room."""
        self._dispatch_soon = None
        snapshot = self._fleet.snapshot
        now = asyncio.get_running_loop().time()
        for model, queue in self._queues.items():
            if not len(queue):
                continue
            room = self._with_room(snapshot.candidates(model))
            while room and len(queue):
                waiting = queue.pop()
                assert waiting is not None
                self._taken(waiting)
                if waiting.future.cancelled():  # its client left; `_left` has not run yet
                    self._client_left(waiting)
                    continue
                engine = waiting.choose(room)
                if engine is None:
                    waiting.future.set_result(self._chose_none(waiting.ask, waiting.verdict))
                    continue
                granted = self._grant(waiting.ask, engine, waiting.verdict, now - waiting.since)
                waiting.future.set_result(granted)
                if not self._has_room(engine):
                    room = [e for e in room if e is not engine]

    # -- tickets ------------------------------------------------------------------------------

    def moved(self, old: str, new: str) -> None:
        self._busy_add(old, -1)
        self._busy_add(new, 1)

    def _busy_add(self, engine_id: str, delta: int) -> None:
        busy = self._busy.get(engine_id, 0) + delta
        if busy > 0:
            self._busy[engine_id] = busy
        else:
            self._busy.pop(engine_id, None)
        if delta < 0 and self._queued:
            self._soon()

    def _active_add(self, tenant: str, delta: int) -> None:
        active = self._active.get(tenant, 0) + delta
        if active > 0:
            self._active[tenant] = active
        else:
            self._active.pop(tenant, None)

    def ended(self, ticket: Ticket, prompt: int | None, completion: int | None) -> None:
        tenant = ticket.tenant
        self._busy_add(ticket.engine_id, -1)
        if tenant.max_concurrency:  # counted only where there is a limit to hold
            self._active_add(tenant.name, -1)
        if prompt is None and completion is None:
            return
        self._metrics.tenant_tokens(tenant, prompt or 0, completion or 0)
        if ticket.reserved > 0:
            used = (prompt or 0) + (completion or 0)
            self.store.settle(tenant.name, ticket.window, used - ticket.reserved)
