"""An engine's capacity, learned from its running and waiting gauges, raised with patience."""

from __future__ import annotations

import itertools

import pytest

from headcount.fleet.capacity import MAX_PATIENCE, Capacity, learn_capacity

__all__: list[str] = []


@pytest.mark.parametrize(
    ("known", "running", "waiting", "learned"),
    [
        (Capacity(), 3, 0, Capacity()),  # never queued: nothing known
        (Capacity(), 4, 2, Capacity(4)),  # queues while running 4: that is what it runs
        (Capacity(8), 4, 1, Capacity(4)),  # queues at 4 now (longer prompts): down at once
        (Capacity(), 0, 3, Capacity(1)),  # queues with nothing running (starting): at least one
        (Capacity(4), 4, 0, Capacity(5, raised=True)),  # full, nothing waits: one more
        (Capacity(16), 16, 0, Capacity(18, raised=True)),  # by an eighth when larger
        (Capacity(16), 10, 0, Capacity(16)),  # below capacity, nothing waiting: no news
    ],
)
def test_capacity_from_one_scrape(
    known: Capacity, running: float, waiting: float, learned: Capacity
) -> None:
    assert learn_capacity(known, running, waiting) == learned


def test_each_raise_the_engine_refuses_doubles_the_wait_before_the_next() -> None:
    known = learn_capacity(Capacity(), 4, 3)  # learned: 4
    raises = []
    for scrape in range(400):
        running = min(known.value or 0, 4)  # the engine's real limit is 4
        waiting = 1 if (known.value or 0) > 4 else 0  # the router sends what it believes
        known = learn_capacity(known, running, waiting)
        if known.raised and known.full == 0 and known.value == 5:
            raises.append(scrape)
    gaps = [later - earlier for earlier, later in itertools.pairwise(raises)]
    assert gaps[:6] == [3, 5, 9, 17, 33, 65]  # a raise, a scrape to undo it, then 2, 4, 8 ...
    assert max(gaps) == MAX_PATIENCE + 1
