"""A static list is synced at once, stamped by the injected clocks, and never goes stale."""

from __future__ import annotations

import asyncio

from headcount.config import ProbeSettings
from headcount.discovery.static import StaticSource
from headcount.fleet import Fleet
from tests.support import wait_until

URLS = ("http://127.0.0.1:1", "http://127.0.0.1:2")


async def test_the_list_is_applied_and_stamped_by_the_injected_clocks() -> None:
    fleet = Fleet(unhealthy_after=ProbeSettings().unhealthy_after)
    source = StaticSource(fleet, URLS, clock=lambda: 42.0, wall_clock=lambda: 1.7e9)
    task = asyncio.create_task(source.run())
    try:
        await wait_until(lambda: source.status.synced, what="the list applied")
        status = source.status
        assert fleet.source_ids("static") == set(URLS)
        assert status.last_list_success == 42.0 and status.last_attempt_finished == 42.0
        assert status.wall_last_sync == 1.7e9
        assert not status.can_go_stale
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled(), "the source ended on its own"
