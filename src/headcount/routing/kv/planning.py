"""The placement plan as a stream: re-built every `interval` seconds, used only while fresh.

`Placement` owns the traffic counts (`traffic.py`) and the current plan
(`placement.py`). Once started, it re-plans every `interval` over the
fleet's routable engines; a round gives no plan, and routing falls back to the greedy choice,
when an engine's cache index is not usable (stale, off: the plan would rest
on what the router cannot know), when an engine's cache size or block size
is not scraped yet, or when the engines' block sizes differ. A plan older
than `max_age` (the task stopped or failed) is not used either. `/health`
shows the state (`status`) beside the indexes' own.

An engine's usable cache is its scraped `num_gpu_blocks` less what the
requests in flight there hold of their own (past their group's head: the
traffic's mean).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from headcount.clock import Clock, Sleep
from headcount.fleet import Engine, Fleet
from headcount.routing.kv.placement import EngineRoom, PlacementSettings, Plan, plan_placement
from headcount.routing.kv.traffic import PrefixTraffic

__all__ = ["Placement", "PlacementStatus"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PlacementStatus:
    """The plan as `/health` shows it."""

    used: bool
    reason: str
    age: float | None
    """Seconds since the plan in use was built; None: none."""
    homed: int
    """Prefix groups with homes."""
    spill: tuple[str, ...]
    """The spill engines' ids."""


class Placement:
    """The traffic counts, and the plan built on them and the fleet every `interval`."""

    def __init__(
        self, settings: PlacementSettings | None = None, clock: Clock = time.monotonic
    ) -> None:
        self.settings = PlacementSettings() if settings is None else settings
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self.traffic = PrefixTraffic(self.settings.half_life)
        self._plan: Plan | None = None
        self._built_at = 0.0
        self._decayed_at = clock()
        self._reason = "no plan built yet"

    def current(self) -> Plan | None:
        """The plan, while it is fresh."""
        plan = self._plan
        if plan is None or self._clock() - self._built_at > self.settings.max_age:
            return None
        return plan

    def rebuild(self, engines: Sequence[Engine], usable: Callable[[str], bool]) -> None:
        """One round over `engines`, routable; `usable(id)`: the engine's index is usable."""
        now = self._clock()
        self.traffic.decay(now - self._decayed_at)
        self._decayed_at = now
        rooms, why = self._rooms(engines, usable)
        if rooms is None:
            if self._plan is not None:
                _log.info("kv placement: no plan (%s); routing greedily", why)
            self._plan, self._reason = None, why
            return
        traffic = self.traffic
        self._plan = plan_placement(
            traffic.groups(),
            rooms,
            self._plan,
            self.settings,
            spill_overflow=traffic.spill_overflow,
        )
        self._built_at, self._reason = now, "planned"

    def _rooms(
        self, engines: Sequence[Engine], usable: Callable[[str], bool]
    ) -> tuple[list[EngineRoom] | None, str]:
        if not engines:
            return None, "no routable engine"
        unusable = [e.spec.name for e in engines if not usable(e.id)]
        if unusable:
            return None, f"kv index not usable on {', '.join(sorted(unusable))}"
        unknown = [e.spec.name for e in engines if not e.load.kv_capacity_blocks]
        if unknown:
            return None, f"cache size not scraped yet on {', '.join(sorted(unknown))}"
        if len({e.load.kv_block_size for e in engines}) > 1:
            return None, "the engines' block sizes differ"
        held = self.traffic.held_per_request()
        rooms = []
        for engine in engines:
            capacity = engine.load.kv_capacity_blocks or 0
            free = capacity - int(engine.load.in_flight * held)
            rooms.append(EngineRoom(engine.id, max(0, free)))
        return rooms, ""

    def status(self) -> PlacementStatus:
        plan = self.current()
        if plan is None:
            reason = self._reason if self._plan is None else "the plan is too old"
            return PlacementStatus(False, reason, None, 0, ())
        age = self._clock() - self._built_at
        return PlacementStatus(True, self._reason, age, len(plan.homes), plan.spill)

    def start(
        self, fleet: Fleet, usable: Callable[[str], bool], sleep: Sleep = asyncio.sleep
    ) -> None:
        """Re-plan every `interval` over the fleet's routable engines until `close`."""
        run = self._run(fleet, usable, sleep)
        self._task = asyncio.get_running_loop().create_task(run, name="kv placement")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self, fleet: Fleet, usable: Callable[[str], bool], sleep: Sleep) -> None:
        while True:
            try:
                self.rebuild(fleet.snapshot.routable, usable)
            except Exception:
                _log.exception("kv placement: a plan failed")
            await sleep(self.settings.interval)
