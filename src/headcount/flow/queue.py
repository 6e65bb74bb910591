"""The router's waiting line: priority bands, then fair shares, then arrival order (pure).

    queue = FairQueue[Item]()
    entry = queue.push(item, priority=10, tenant="chat", weight=2.0, flow="user-7", cost=900)
    queue.pop()            # the next item to dispatch, or None
    queue.remove(entry)    # the client left, or its wait timed out

A higher priority band is always served first. Inside a band, tenants share
by weight and the flows of one tenant (`x-gateway-inference-fairness-id`)
share equally, both by start-time fair queueing (Goyal et al., SIGCOMM 1996):
a tenant's next item is stamped with a virtual start time, `max(band clock,
its previous finish)`, and finishes `cost / weight` later; the smallest start
goes first, and the band's clock is the start of the item last served. A
tenant that was idle starts at the clock, so it gets its share at once
and no credit for the time it was away; items cost what they reserve of the
engines (tokens), so shares are shares of engine time. Inside a flow, arrival
order.

Removal is lazy: a removed entry stays where it is, skipped when reached, so
removing is O(1) and the counts are right at once.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Generic, TypeVar

__all__ = ["FairQueue", "QueueEntry"]

T = TypeVar("T")


class QueueEntry(Generic[T]):
    """One queued item, as `push` returns it for `remove`."""

    __slots__ = ("cost", "item", "live", "priority", "queued_flow")

    def __init__(self, item: T, priority: int, cost: float, queued_flow: _Flow[T]) -> None:
        self.item = item
        self.priority = priority
        self.cost = cost
        self.queued_flow = queued_flow
        self.live = True


class _Fair:
    """Start-time fair queueing among named members (tenants of a band, flows of a tenant)."""

    __slots__ = ("_clock", "_finish", "_heap", "_order")

    def __init__(self, clock: float = 0.0) -> None:
        self._clock = clock
        self._finish: dict[str, float] = {}
        """The virtual finish of each idle member's last item, while it is ahead of the clock
        (behind it, the member restarts at the clock anyway)."""
        self._heap: list[tuple[float, int, str]] = []
        """(start, arrival order, name) of each member holding items: exactly one entry each."""
        self._order = itertools.count()

    @property
    def clock(self) -> float:
        return self._clock

    def activate(self, name: str) -> None:
        """`name` holds items now and held none: it starts at the clock, or at its last
        finish if that is later (it was served ahead of its share just before)."""
        start = max(self._clock, self._finish.pop(name, 0.0))
        heapq.heappush(self._heap, (start, next(self._order), name))

    def next(self) -> str | None:
        """The member whose turn it is, left in place; None when none holds items."""
        return self._heap[0][2] if self._heap else None

    def served(self, cost: float, weight: float, more: bool) -> None:
        """The member `next` named was served an item of `cost`; `more`: it holds items still."""
        start, _, name = heapq.heappop(self._heap)
        self._clock = start
        finish = start + cost / weight
        if more:
            heapq.heappush(self._heap, (finish, next(self._order), name))
        elif finish > start:
            self._finish[name] = finish
        if len(self._finish) > 64:
            self._finish = {n: f for n, f in self._finish.items() if f > start}


class _Flow(Generic[T]):
    __slots__ = ("entries", "name", "tenant")

    def __init__(self, name: str, tenant: _Tenant[T]) -> None:
        self.name = name
        self.tenant = tenant
        self.entries: deque[QueueEntry[T]] = deque()


class _Tenant(Generic[T]):
    __slots__ = ("band", "flows", "held", "name", "turns", "weight")

    def __init__(self, name: str, weight: float, band: _Band[T]) -> None:
        self.name = name
        self.weight = weight
        self.band = band
        self.flows: dict[str, _Flow[T]] = {}
        self.turns = _Fair()
        self.held = 0
        """Entries in its flows, removed ones not yet skipped included."""


class _Band(Generic[T]):
    __slots__ = ("held", "live", "tenants", "turns")

    def __init__(self, clock: float = 0.0) -> None:
        self.tenants: dict[str, _Tenant[T]] = {}
        self.turns = _Fair(clock)
        self.live = 0
        self.held = 0


class FairQueue(Generic[T]):
    """Items waiting to be dispatched; see the module docstring."""

    def __init__(self) -> None:
        self._bands: dict[int, _Band[T]] = {}
        self._priorities: list[int] = []
        """The bands' priorities, highest first."""
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def depths(self) -> dict[int, int]:
        """Live items per priority."""
        return {priority: band.live for priority, band in self._bands.items() if band.live}

    def push(
        self, item: T, *, priority: int, tenant: str, weight: float, flow: str, cost: float
    ) -> QueueEntry[T]:
        """Queue `item`; `weight` is the tenant's share in its band (the latest given counts),
        `cost` what serving it takes (its reserved tokens)."""
        band = self._bands.get(priority)
        if band is None:
            band = self._bands[priority] = _Band()
            self._priorities = sorted(self._bands, reverse=True)
        return self._append(band, item, priority, tenant, weight, flow, max(cost, 1.0))

    def _append(
        self,
        band: _Band[T],
        item: T,
        priority: int,
        tenant: str,
        weight: float,
        flow: str,
        cost: float,
    ) -> QueueEntry[T]:
        member = band.tenants.get(tenant)
        if member is None:
            member = band.tenants[tenant] = _Tenant(tenant, weight, band)
        member.weight = weight
        queued_flow = member.flows.get(flow)
        if queued_flow is None:
            queued_flow = member.flows[flow] = _Flow(flow, member)
        if not queued_flow.entries:
            member.turns.activate(flow)
        if not member.held:
            band.turns.activate(tenant)
        entry = QueueEntry(item, priority, cost, queued_flow)
        queued_flow.entries.append(entry)
        member.held += 1
        band.held += 1
        band.live += 1
        self._live += 1
        return entry

    def remove(self, entry: QueueEntry[T]) -> None:
        """Take `entry` out (it stays in place, skipped when reached); no-op if already out.
        A band whose removed entries outnumber its live ones is rebuilt, so that removed
        entries never pile up while the band waits for room."""
        if not entry.live:
            return
        entry.live = False
        self._live -= 1
        band = entry.queued_flow.tenant.band
        band.live -= 1
        if band.held - band.live > max(band.live, 64):
            self._rebuild(entry.priority, band)

    def pop(self) -> T | None:
        """The next item by priority, fair share and arrival; None when nothing is queued."""
        for priority in self._priorities:
            band = self._bands[priority]
            if band.live:
                return self._pop_band(band)
        return None

    def _pop_band(self, band: _Band[T]) -> T:
        while True:
            tenant_name = band.turns.next()
            assert tenant_name is not None, "a band with live items has a tenant in turn"
            member = band.tenants[tenant_name]
            flow_name = member.turns.next()
            assert flow_name is not None, "a tenant holding items has a flow in turn"
            queued_flow = member.flows[flow_name]
            entry = queued_flow.entries.popleft()
            member.held -= 1
            band.held -= 1
            cost = entry.cost if entry.live else 0.0  # a removed entry is skipped for free
            member.turns.served(cost, 1.0, bool(queued_flow.entries))
            band.turns.served(cost, member.weight, member.held > 0)
            if not queued_flow.entries:
                del member.flows[flow_name]
            if not member.held:
                del band.tenants[tenant_name]
            if entry.live:
                entry.live = False
                band.live -= 1
                self._live -= 1
                return entry.item

    def _rebuild(self, priority: int, band: _Band[T]) -> None:
        """The band anew from its live entries, each tenant's and flow's order kept; the
        band's clock carries on."""
        fresh: _Band[T] = _Band(band.turns.clock)
        self._bands[priority] = fresh
        live = [
            entry
            for member in band.tenants.values()
            for queued_flow in member.flows.values()
            for entry in queued_flow.entries
            if entry.live
        ]
        self._live -= len(live)
        for entry in live:
            member = entry.queued_flow.tenant
            rebuilt = self._append(
                fresh,
                entry.item,
                priority,
                member.name,
                member.weight,
                entry.queued_flow.name,
                entry.cost,
            )
            entry.queued_flow = rebuilt.queued_flow
            rebuilt_flow = rebuilt.queued_flow
            rebuilt_flow.entries[-1] = entry
