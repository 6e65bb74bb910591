"""Long-lived tasks under the supervisor: a crash is logged, counted, and restarted with back-off.

The back-off runs on a fake clock. The router's own tasks under the
supervisor, in a running router, are tests/process/test_supervise.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

import pytest

from headcount.config import SupervisionSettings
from headcount.fleet import Snapshot
from headcount.supervise import Supervisor
from headcount.surfaces.metrics import Metrics
from tests.support import FakeClock, wait_until

SETTINGS = SupervisionSettings(restart_delay=1.0, restart_delay_max=8.0, healthy_after=60.0)


class Script:
    """A task that, on each start, runs for the next duration, then raises or returns."""

    def __init__(self, clock: FakeClock, runs: list[tuple[float, BaseException | None]]) -> None:
        self._clock = clock
        self._runs: Iterator[tuple[float, BaseException | None]] = iter(runs)
        self.starts = 0
        self.finished = asyncio.Event()

    async def __call__(self) -> None:
        self.starts += 1
        try:
            duration, outcome = next(self._runs)
        except StopIteration:
            self.finished.set()
            await asyncio.Event().wait()  # the last start runs until cancelled
            return
        self._clock.now += duration
        if outcome is not None:
            raise outcome


def restarts(metrics: Metrics, task: str) -> float | None:
    return metrics.registry.get_sample_value("headcount_task_restarts_total", {"task": task})


async def supervising(
    script: Script, clock: FakeClock, metrics: Metrics, settings: SupervisionSettings = SETTINGS
) -> None:
    supervisor = Supervisor(settings, metrics.task_restarts, clock=clock, sleep=clock.sleep)
    task = asyncio.create_task(supervisor.run("worker", script))
    try:
        await wait_until(script.finished.is_set, what="the script played out")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled(), "cancelling the supervisor stops it (and its task)"


def no_fleet() -> Metrics:
    return Metrics(lambda: Snapshot((), 0))


async def test_a_crash_is_logged_with_its_traceback_counted_and_the_task_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, metrics = FakeClock(), no_fleet()
    script = Script(clock, [(5.0, RuntimeError("boom"))])
    await supervising(script, clock, metrics)
    assert script.starts == 2
    assert restarts(metrics, "worker") == 1
    assert clock.slept == [SETTINGS.restart_delay]
    (record,) = [r for r in caplog.records if r.name == "headcount.supervise"]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "task worker stopped (RuntimeError: boom): restarting in 1s"
    assert record.exc_info is not None and record.exc_info[1] is not None


async def test_the_series_exists_before_any_restart() -> None:
    metrics = no_fleet()
    metrics.task_restarts("worker")
    assert restarts(metrics, "worker") == 0


async def test_the_delay_doubles_up_to_the_cap_and_starts_over_after_a_healthy_run() -> None:
    clock, metrics = FakeClock(), no_fleet()
    quick = [(0.5, RuntimeError("again"))] * 5
    healthy = [(SETTINGS.healthy_after, RuntimeError("after a long run"))]
    script = Script(clock, [*quick, *healthy, (0.5, RuntimeError("soon after"))])
    await supervising(script, clock, metrics)
    assert clock.slept == [1.0, 2.0, 4.0, 8.0, 8.0, 1.0, 2.0]
    assert restarts(metrics, "worker") == 7


async def test_a_crash_like_the_last_one_is_one_line_and_a_new_one_has_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, metrics = FakeClock(), no_fleet()
    runs: list[tuple[float, BaseException | None]] = [
        (0.0, ValueError("x")),
        (0.0, ValueError("x")),
        (0.0, KeyError("y")),
    ]
    await supervising(Script(clock, runs), clock, metrics)
    records = [r for r in caplog.records if r.name == "headcount.supervise"]
    assert [r.exc_info is not None for r in records] == [True, False, True]
    assert "stopped again (ValueError: x)" in records[1].getMessage()


async def test_a_task_that_returns_is_restarted_too(caplog: pytest.LogCaptureFixture) -> None:
    clock, metrics = FakeClock(), no_fleet()
    await supervising(Script(clock, [(1.0, None)]), clock, metrics)
    assert restarts(metrics, "worker") == 1
    assert any("task worker stopped (returned)" in r.getMessage() for r in caplog.records)


async def test_cancellation_is_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    clock, metrics = FakeClock(), no_fleet()
    await supervising(Script(clock, []), clock, metrics)
    assert restarts(metrics, "worker") == 0
    assert not [r for r in caplog.records if r.name == "headcount.supervise"]


@pytest.mark.parametrize(
    "settings",
    [
        lambda: SupervisionSettings(restart_delay=0),
        lambda: SupervisionSettings(restart_delay_max=-1),
        lambda: SupervisionSettings(healthy_after=0),
    ],
)
def test_back_off_settings_must_be_positive(settings: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        settings()
