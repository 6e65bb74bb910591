"""An engine's capacity, learned from its running and waiting gauges."""

from __future__ import annotations

import pytest

from headcount.fleet.capacity import learn_capacity

__all__: list[str] = []


@pytest.mark.parametrize(
    ("capacity", "running", "waiting", "learned"),
    [
        (None, 3, 0, None),  # never queued: nothing known
        (None, 4, 2, 4),  # queues while running 4: that is what it runs
        (8, 4, 1, 4),  # queues at 4 now (longer prompts): down at once
        (None, 0, 3, 1),  # queues with nothing running (starting): at least one
        (4, 4, 0, 5),  # runs full, queues nothing: try one more
        (16, 16, 0, 18),  # by an eighth when larger
        (16, 10, 0, 16),  # below capacity, nothing waiting: no news
    ],
)
def test_capacity_from_one_scrape(
    capacity: int | None, running: float, waiting: float, learned: int | None
) -> None:
    assert learn_capacity(capacity, running, waiting) == learned
