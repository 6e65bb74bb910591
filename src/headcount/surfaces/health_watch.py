"""`/health` judged on a tick, so that its changes are logged and its reason reaches the 503.

Nothing else evaluates health unless asked (a probe, a scrape), so a status
that turned degraded at night would go unlogged; and the proxy's 503 for a
fleet with no routable engine must say why (`first sync not done: API server
unreachable`, `no pods match selector app=vlm in namespace default`) without
judging health per request. Every `EVERY` seconds `HealthWatch.check` judges
it once: a status unlike the last one is logged with its reasons (WARNING
for a change to degraded or unavailable, INFO for the first judgement and a
return to ok; a change shorter than a tick may go unseen), and the
reason no engine is routable is left on the fleet (`Fleet.unroutable_reason`)
for the proxy to quote.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from headcount.fleet import Fleet
from headcount.surfaces.health import HealthReport, Status

__all__ = ["EVERY", "HealthWatch"]

EVERY = 1.0
"""Seconds between judgements: a 503 quotes a reason at most this old, for one evaluation
(a walk over the sources and the fleet's engines) a second."""

_log = logging.getLogger("headcount.health")


class HealthWatch:
    """Judges health with `report` on a tick; logs status changes, publishes the reason."""

    def __init__(
        self,
        report: Callable[[], HealthReport],
        fleet: Fleet,
        *,
        every: float = EVERY,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._report = report
        self._fleet = fleet
        self._every = every
        self._sleep = sleep
        self._status: Status | None = None

    async def run(self) -> None:
        """Check every `every` seconds until cancelled."""
        while True:
            self.check()
            await self._sleep(self._every)

    def check(self) -> HealthReport:
        """Judge health now: publish why no engine is routable, log a changed status."""
        report = self._report()
        self._fleet.unroutable_reason = report.no_engine
        status, previous = report.status, self._status
        if status is not previous:
            self._status = status
            reasons = list(report.body["reasons"])
            # the first judgement is the state the router starts in, not a change for the worse
            log = _log.info if status is Status.OK or previous is None else _log.warning
            log(
                "/health %s%s%s",
                status.value,
                "" if previous is None else f" (was {previous.value})",
                f": {'; '.join(reasons)}" if reasons else "",
                extra={
                    "event": "health",
                    "status": status.value,
                    "previous": None if previous is None else previous.value,
                    "reasons": reasons,
                },
            )
        return report
