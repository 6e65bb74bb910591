"""What an engine's stream may cost: a budget refilled with time, logs kept few, dials spaced."""

from __future__ import annotations

import logging

import pytest

from headcount.kvindex.budget import Budget
from headcount.kvindex.redial import Redial
from headcount.log_limit import LogLimit
from tests.support import FakeClock


def test_a_budget_spends_what_is_there_and_repays_debt_with_time() -> None:
    clock = FakeClock()
    budget = Budget(rate=100, burst=100, clock=clock)
    assert budget.take(60) and not budget.take(60)
    budget.charge(140)  # 40 left, now 100 in debt
    assert budget.overdue() == pytest.approx(1.0)
    clock.now += 0.5
    assert budget.overdue() == pytest.approx(0.5)
    clock.now += 10
    assert budget.overdue() == 0 and budget.take(100) and not budget.take(1)


def test_a_kind_of_line_is_logged_once_an_interval_with_the_count_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    logger = logging.getLogger("test.log_limit")
    limit = LogLimit(logger, every=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.log_limit"):
        for n in range(5):
            limit.log("gap", logging.INFO, "gap %d", n)
            limit.log("restart", logging.WARNING, "restart %d", n)
        clock.now += 60
        limit.log("gap", logging.INFO, "gap %d", 5)
    assert [r.getMessage() for r in caplog.records] == [
        "gap 0",
        "restart 0",
        "gap 5 (and 4 more like it in the last 60s)",
    ]
    assert limit.left_out == 8


def test_a_publisher_that_keeps_losing_its_session_is_dialled_ever_later() -> None:
    clock = FakeClock()
    redial = Redial(0.1, 5.0, clock)
    waits = []
    for _ in range(8):
        redial.up()
        clock.now += 0.5  # the session ends soon after its handshake
        waits.append(redial.lost())
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    redial.up()
    clock.now += 60  # a session that lasted
    assert redial.lost() == 0.1
