"""Flow control: every request of a tenant either goes to an engine with room, waits its turn
in the router, or is refused with what the client should do.

    control = FlowControl(fleet, settings.flow, store, lambda: credentials.tenants)
    ticket = Ticket(control, tenant, request, model, body)  # ticket.py
    decision = control.admit(ticket, candidates, policy, features)  # Ticket | Refusal | Awaitable
    ...
    ticket.done(prompt_tokens, completion_tokens)  # the request's end, once

In order, a request is refused (429) when its tenant has `max_concurrency`
requests in flight already (`concurrency_limited`), when it is sheddable
(priority below 0) and no engine has room (`shed`), when the queue holds
`max_queued` requests (`queue_full`), and when its tenant's limits store says
no (`rate_limited`, with the store's `Retry-After`). Otherwise it goes at once
to an engine with room, through the routing policy (a `Picker`), if no request
of its model waits; else it waits in the `FairQueue` of its model, until an
engine has room (dispatched by priority, fair share and arrival) or
`queue_timeout` passes (503).

An engine has room while the requests this router has granted there
(`EngineLoad.granted`) are fewer than its learned capacity
(`fleet/capacity.py`): the router's own count, never
older than the last request's end, so a burst between two scrapes cannot
overfill it. Every granted request holds a `Ticket` until its end: its
tenant's concurrency, its engine's slot (moved on failover) and its token
reservation, settled on the usage the engine reports. A slot given back
dispatches the queue on the next turn of the loop; so does a change of the
fleet, and a tick every `_TICK` seconds while requests wait (a capacity the
prober raised frees no slot). What each tenant was granted, refused and used
is counted in `tallies` (`tally.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from headcount.auth.tenants import Tenants
from headcount.config import FlowSettings
from headcount.fleet import Engine, Fleet, FleetChange
from headcount.flow.limits import Charge, LimitsStore, Verdict, ratelimit_headers
from headcount.flow.queue import FairQueue, QueueEntry
from headcount.flow.tally import Tallies, TenantTally
from headcount.flow.ticket import Decision, Owner, Picker, Refusal, Ticket

__all__ = ["FlowControl"]

_TICK = 0.25
"""Seconds between dispatch attempts while requests wait and no slot is given back."""


def _has_room(engine: Engine) -> bool:
    load = engine.load
    capacity = load.concurrency.value
    return capacity is None or load.granted < capacity


class _Waiting:
    """A request in the queue: its ticket, how it picks, where its answer goes."""

    __slots__ = ("entry", "features", "future", "picker", "since", "ticket", "timer", "verdict")

    def __init__(
        self,
        ticket: Ticket,
        picker: Picker,
        features: Any,
        verdict: Verdict | None,
        future: asyncio.Future[Ticket | Refusal],
        since: float,
    ) -> None:
        self.ticket = ticket
        self.picker = picker
        self.features = features
        self.verdict = verdict
        self.future = future
        self.since = since
        self.entry: QueueEntry[_Waiting] | None = None
        self.timer: asyncio.TimerHandle | None = None


class FlowControl(Owner):
    """The router's admission under load; see the module docstring."""

    def __init__(
        self,
        fleet: Fleet,
        settings: FlowSettings,
        store: LimitsStore,
        tenants: Callable[[], Tenants | None] = lambda: None,
    ) -> None:
        """`tenants`: the tenants file in force, for the objectives requests name."""
        self._fleet = fleet
        self.tenants = tenants
        self._settings = settings
        self.store = store
        self.tallies = Tallies()
        """What each tenant was granted, refused and used (read at each scrape)."""
        self._queues: dict[str, FairQueue[_Waiting]] = {}
        self._queued = 0
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

    # -- admission ----------------------------------------------------------------------------

    def admit(
        self, ticket: Ticket, candidates: Sequence[Engine], picker: Picker, features: Any
    ) -> Decision:
        """`ticket`'s way in among `candidates` (not empty), `picker` choosing among those with
        room by `features`; see the module docstring for the order of the checks."""
        tenant = ticket.tenant
        name = tenant.name
        if tenant.max_concurrency and self._active.get(name, 0) >= tenant.max_concurrency:
            return self._refuse(
                ticket,
                "concurrency_limited",
                f"tenant {name} has {tenant.max_concurrency} requests in flight, its "
                "max_concurrency; retry when one ends",
                1.0,
            )
        room = self._room(ticket.model, candidates)
        if not room:
            refusal = self._cannot_wait(ticket)
            if refusal is not None:
                return refusal
        if not (tenant.requests_per_minute or tenant.tokens_per_minute):
            return self._place(ticket, room, picker, features, None)
        judged = self.store.take(
            Charge(name, tenant.requests_per_minute, tenant.tokens_per_minute, ticket.tokens)
        )
        if isinstance(judged, Verdict):
            return self._judged(ticket, room, picker, features, judged)
        return self._judged_later(ticket, picker, features, judged)

    def _cannot_wait(self, ticket: Ticket) -> Refusal | None:
        """A refusal when the request, which must wait, may not: it is sheddable, or the
        queue is full."""
        if ticket.priority < 0:
            return self._refuse(
                ticket,
                "shed",
                f"every engine serving `{ticket.model}` is busy and this request's priority "
                f"({ticket.priority}) is sheddable; retry later",
                self._settings.queue_timeout / 10,
            )
        if self._queued >= self._settings.max_queued:
            return self._refuse(
                ticket,
                "queue_full",
                f"{self._queued} requests wait for an engine already (--max-queued); retry later",
                self._settings.queue_timeout / 10,
            )
        return None

    async def _judged_later(
        self, ticket: Ticket, picker: Picker, features: Any, judged: Awaitable[Verdict]
    ) -> Ticket | Refusal:
        verdict = await judged
        candidates = self._fleet.snapshot.candidates(ticket.model)
        if not candidates:
            self._give_back(ticket, verdict)
            return self._refuse(ticket, "no_engine", f"no engine serves `{ticket.model}` now", 1.0)
        room = self._room(ticket.model, candidates)
        decision = self._judged(ticket, room, picker, features, verdict)
        if isinstance(decision, (Ticket, Refusal)):
            return decision
        return await decision

    def _judged(
        self,
        ticket: Ticket,
        room: Sequence[Engine],
        picker: Picker,
        features: Any,
        verdict: Verdict,
    ) -> Decision:
        if verdict.allowed:
            return self._place(ticket, room, picker, features, verdict)
        name = ticket.tenant.name
        if verdict.reason == "tokens_over_limit":
            message = (
                f"this request reserves {ticket.tokens} tokens, more than tenant {name}'s "
                f"tokens_per_minute ({ticket.tenant.tokens_per_minute}); lower max_tokens"
            )
        else:
            message = f"tenant {name} is over its {verdict.reason.replace('_', ' ')}"
        return self._refuse(
            ticket, "rate_limited", message, verdict.retry_after, ratelimit_headers(verdict)
        )

    def _place(
        self,
        ticket: Ticket,
        room: Sequence[Engine],
        picker: Picker,
        features: Any,
        verdict: Verdict | None,
    ) -> Decision:
        """Grant one of the engines with `room` now, or queue (a refusal if it may not)."""
        if room:
            engine = picker.select(room, features)
            if engine is None:
                return self._chose_none(ticket, verdict)
            return self._grant(ticket, engine, verdict, 0.0)
        refusal = self._cannot_wait(ticket)
        if refusal is not None:
            self._give_back(ticket, verdict)
            return refusal
        return self._enqueue(ticket, picker, features, verdict)

    def _room(self, model: str, candidates: Sequence[Engine]) -> Sequence[Engine]:
        """The engines a request for `model` may go to now: none while others wait for one
        (they go first), else the `candidates` with room."""
        if self._queued and len(self._queues.get(model) or ()):
            return []
        return self._with_room(candidates)

    def _with_room(self, candidates: Sequence[Engine]) -> Sequence[Engine]:
        """The `candidates` whose capacity is unknown or above what is granted there: the
        same sequence when all have room (an unsaturated fleet's every request), not a copy."""
        for engine in candidates:
            if not _has_room(engine):
                return [engine for engine in candidates if _has_room(engine)]
        return candidates

    def _grant(
        self, ticket: Ticket, engine: Engine, verdict: Verdict | None, waited: float
    ) -> Ticket:
        tenant = ticket.tenant
        if tenant.max_concurrency:
            self._active_add(tenant.name, 1)
        engine.load.granted += 1
        ticket.tally = tally = self.tallies[tenant.name]
        if waited:
            tally.wait(waited)
        else:  # most requests: no wait at all
            tally.waits[0] += 1
        ticket.engine = engine
        ticket.body = None  # its reserve was worked out if anything needed it
        if verdict is not None:
            ticket.judged(verdict)
        return ticket

    def _refuse(
        self, ticket: Ticket, outcome: str, message: str, retry_after: float, headers: bytes = b""
    ) -> Refusal:
        self.tallies[ticket.tenant.name].refused(outcome)
        return Refusal(outcome, message, max(retry_after, 1.0) if retry_after > 0 else 0.0, headers)

    def _chose_none(self, ticket: Ticket, verdict: Verdict | None) -> Refusal:
        """The routing policy picked none of the engines with room: refused, reservation back."""
        self._give_back(ticket, verdict)
        return self._refuse(ticket, "no_engine", "the routing policy chose no engine", 1.0)

    def _give_back(self, ticket: Ticket, verdict: Verdict | None) -> None:
        """A charged request was refused after all: its reserved tokens go back."""
        if verdict is not None and verdict.tokens is not None and ticket.tokens:
            self.store.settle(ticket.tenant.name, verdict.window, -ticket.tokens)

    # -- the queue ----------------------------------------------------------------------------

    def _enqueue(
        self, ticket: Ticket, picker: Picker, features: Any, verdict: Verdict | None
    ) -> Awaitable[Ticket | Refusal]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Ticket | Refusal] = loop.create_future()
        waiting = _Waiting(ticket, picker, features, verdict, future, loop.time())
        queue = self._queues.get(ticket.model)
        if queue is None:
            queue = self._queues[ticket.model] = FairQueue()
        tenant = ticket.tenant
        waiting.entry = queue.push(
            waiting,
            priority=ticket.priority,
            tenant=tenant.name,
            weight=tenant.weight,
            flow=ticket.flow,
            cost=ticket.tokens,
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
    async def _wait(future: asyncio.Future[Ticket | Refusal]) -> Ticket | Refusal:
        """The queued request's answer. Its client may leave while waiting (the future is
        cancelled: it leaves the queue), or just after its grant, before it could use it:
        the grant is given back then."""
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                granted = future.result()
                if isinstance(granted, Ticket):
                    granted.done(0, 0)
            raise

    def _unqueue(self, waiting: _Waiting) -> bool:
        """Take `waiting` out of its queue; False if it was out already."""
        entry = waiting.entry
        if entry is None:
            return False
        self._queues[waiting.ticket.model].remove(entry)
        self._taken(waiting)
        return True

    def _taken(self, waiting: _Waiting) -> None:
        """`waiting` is out of its queue (removed or popped): counts and timer follow."""
        waiting.entry = None
        self._queued -= 1
        tenant = waiting.ticket.tenant
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
        self._give_back(waiting.ticket, waiting.verdict)
        timeout = self._settings.queue_timeout
        waiting.future.set_result(
            self._refuse(
                waiting.ticket,
                "queue_timeout",
                f"no engine serving `{waiting.ticket.model}` had room within {timeout:g}s "
                "(--queue-timeout); retry later",
                timeout / 10,
            )
        )

    def _left(self, waiting: _Waiting) -> None:
        """The future is done: if cancelled (the client left), the request leaves the queue."""
        if waiting.future.cancelled() and self._unqueue(waiting):
            self._client_left(waiting)

    def _client_left(self, waiting: _Waiting) -> None:
        self._give_back(waiting.ticket, waiting.verdict)
        self.tallies[waiting.ticket.tenant.name].refused("client_left")

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
                engine = waiting.picker.select(room, waiting.features)
                if engine is None:
                    waiting.future.set_result(self._chose_none(waiting.ticket, waiting.verdict))
                    continue
                granted = self._grant(waiting.ticket, engine, waiting.verdict, now - waiting.since)
                waiting.future.set_result(granted)
                room = self._with_room(room)

    # -- tickets ------------------------------------------------------------------------------

    def moved(self, old: Engine, new: Engine) -> None:
        new.load.granted += 1
        self._free(old)

    def _free(self, engine: Engine) -> None:
        """A slot on `engine` is given back: the queue may go on."""
        engine.load.granted -= 1
        if self._queued:
            self._soon()

    def _active_add(self, tenant: str, delta: int) -> None:
        active = self._active.get(tenant, 0) + delta
        if active > 0:
            self._active[tenant] = active
        else:
            self._active.pop(tenant, None)

    def ended(
        self, ticket: Ticket, tally: TenantTally, prompt: int | None, completion: int | None
    ) -> None:
        tenant = ticket.tenant
        self._free(ticket.engine)
        if tenant.max_concurrency:  # counted only where there is a limit to hold
            self._active_add(tenant.name, -1)
        if prompt is None and completion is None:
            return
        prompt, completion = prompt or 0, completion or 0
        tally.prompt += prompt
        tally.completion += completion
        verdict = ticket.verdict
        if verdict is not None and verdict.tokens is not None:
            self.store.settle(tenant.name, verdict.window, prompt + completion - ticket.tokens)
