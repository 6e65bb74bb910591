"""A fixed list of engine URLs (`--discovery static --backends ...`).

The list itself cannot go stale, so the source is synced at once and needs no
API; the prober still decides, engine by engine, whether each one is routable.
An engine that fails its probes stays listed as unhealthy, never forgotten.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from headcount.clock import Clock
from headcount.discovery.source import SourceStatus, Watched
from headcount.fleet import EngineSpec, Fleet

__all__ = ["StaticSource", "static_specs"]

SOURCE = "static"


def static_specs(urls: Sequence[str]) -> list[EngineSpec]:
    """One engine per URL; the URL is its identity."""
    return [EngineSpec(id=url, name=url, url=url, source=SOURCE) for url in urls]


class StaticSource:
    def __init__(
        self,
        fleet: Fleet,
        urls: Sequence[str],
        *,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        self._fleet = fleet
        self._urls = tuple(urls)
        self._clock = clock
        self._wall_clock = wall_clock
        self.status = SourceStatus(
            name=SOURCE, kind=SOURCE, can_go_stale=False, watches=Watched("backends")
        )

    async def run(self) -> None:
        self._fleet.reconcile(SOURCE, static_specs(self._urls))
        now = self._clock()
        self.status.synced = True
        self.status.last_list_success = now
        self.status.last_attempt_finished = now
        self.status.wall_last_sync = self._wall_clock()
        await asyncio.Event().wait()
