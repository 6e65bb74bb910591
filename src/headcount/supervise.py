"""Long-lived tasks that never die unobserved: a crash is logged, counted, and the task restarted.

A background task that raises dies quietly in asyncio ("Task exception was
never retrieved", at garbage collection at best) while the router carries on
with state nobody updates any more. `Supervisor.run` keeps such a task (the
prober, the gRPC health refresher, the key-file watcher) going for the life of
the process: when it raises, or returns, which a long-lived task must not, the
crash is logged with its traceback (a crash repeating the previous one gets
one line), counted in `headcount_task_restarts_total{task}`, and the task is
started again after a back-off that doubles with each crash in a row up to a
cap and starts over once the task has run `healthy_after` before crashing.
Cancelling `run` stops the task. Discovery loops are not supervised here: a
dead one fails `/livez`, and the restart of the pod is their supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from headcount.clock import Clock, Sleep
from headcount.config import SupervisionSettings

__all__ = ["RestartCounter", "Supervisor"]

_log = logging.getLogger(__name__)

RestartCounter = Callable[[str], Callable[[], None]]
"""Given a task's name, what to call on each of its restarts (`Metrics.task_restarts`)."""


class Supervisor:
    """Runs long-lived tasks, restarting each one that ends, with back-off."""

    def __init__(
        self,
        settings: SupervisionSettings,
        restarts: RestartCounter,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._restarts = restarts
        self._clock = clock
        self._sleep = sleep

    async def run(self, name: str, start: Callable[[], Awaitable[None]]) -> None:
        """Await `start()` again and again until cancelled."""
        settings = self._settings
        count_restart = self._restarts(name)
        delay = settings.restart_delay
        last: str | None = None
        while True:
            started = self._clock()
            error: Exception | None = None
            try:
                await start()
            except Exception as exc:
                error = exc
            if self._clock() - started >= settings.healthy_after:
                delay = settings.restart_delay
            what = "returned" if error is None else f"{type(error).__name__}: {error}"
            if what != last:
                _log.error(
                    "task %s stopped (%s): restarting in %gs", name, what, delay, exc_info=error
                )
            else:
                _log.error("task %s stopped again (%s): restarting in %gs", name, what, delay)
            last = what
            await self._sleep(delay)
            count_restart()
            delay = min(delay * 2, settings.restart_delay_max)
