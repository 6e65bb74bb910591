"""Reflectors feeding one source: run together, their freshness merged, listed together.

A source that joins resources (Services with their EndpointSlices, an
InferencePool with its pods) runs one `Reflector` per resource. `Joined` runs
them as one task, keeps the source's `SourceStatus` as fresh as its stalest
side and connected only when every side is (`merge_statuses`), and says when
every side has listed once (`listed`): before that the join is unknown and the
source leaves the fleet alone.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from headcount.clock import Clock, Sleep
from headcount.discovery.listwatch import KubeObject, ListerWatcher
from headcount.discovery.reflector import OnEvent, OnList, Reflector, ReflectorTiming
from headcount.discovery.source import SourceStatus

__all__ = ["Joined", "Side", "merge_statuses"]


@dataclass(frozen=True)
class Side:
    """One resource of a join: where it is listed, which objects, and who is told."""

    resource: str
    """Its plural (`services`, `pods`): names its part of the status (`k8s-services/pods`)."""
    lister_watcher: ListerWatcher
    label_selector: str
    on_list: OnList
    on_event: OnEvent


class Joined:
    """The reflectors of `sides`, reporting as one source to `status`."""

    def __init__(
        self,
        status: SourceStatus,
        sides: Sequence[Side],
        *,
        timing: ReflectorTiming,
        clock: Clock,
        sleep: Sleep,
    ) -> None:
        self._status = status
        self._sides = len(sides)
        self._listed: set[str] = set()
        self._parts = tuple(
            SourceStatus(name=f"{status.name}/{side.resource}", kind=status.kind) for side in sides
        )
        self._reflectors = tuple(
            Reflector(
                side.lister_watcher,
                status=part,
                on_list=self._listing(side),
                on_event=side.on_event,
                label_selector=side.label_selector,
                timing=timing,
                on_status=self._merge,
                clock=clock,
                sleep=sleep,
            )
            for side, part in zip(sides, self._parts, strict=True)
        )

    @property
    def listed(self) -> bool:
        """Every side listed once: the join is known."""
        return len(self._listed) == self._sides

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for reflector in self._reflectors:
                group.create_task(reflector.run())

    def _listing(self, side: Side) -> OnList:
        """`side.on_list`, called once the side counts as listed."""

        def on_list(objects: list[KubeObject]) -> None:
            self._listed.add(side.resource)
            side.on_list(objects)

        return on_list

    def _merge(self) -> None:
        merge_statuses(self._status, self._parts)


def merge_statuses(merged: SourceStatus, parts: Sequence[SourceStatus]) -> None:
    """Set `merged`'s freshness from its `parts`: as fresh as the stalest, connected when all
    are, failing when one is."""
    merged.synced = all(part.synced for part in parts)
    merged.last_list_success = _oldest(part.last_list_success for part in parts)
    merged.last_event = _oldest(part.last_success for part in parts)
    merged.last_attempt_started = _oldest(part.last_attempt_started for part in parts)
    merged.last_attempt_finished = _oldest(part.last_attempt_finished for part in parts)
    merged.watch_connected = all(part.watch_connected for part in parts)
    merged.relists = sum((part.relists for part in parts), Counter())
    errors = [f"{part.name}: {part.last_error}" for part in parts if part.last_error]
    merged.last_error = "; ".join(errors) or None
    failing = [part.failing_since for part in parts if part.failing_since is not None]
    merged.failing_since = min(failing, default=None)
    merged.api_unreachable = any(part.api_unreachable for part in parts)
    merged.resource_version = ",".join(
        f"{part.name.rsplit('/', 1)[-1]}={part.resource_version}" for part in parts
    )
    merged.wall_last_sync = _oldest(part.wall_last_sync for part in parts)


def _oldest(times: Iterable[float | None]) -> float | None:
    """The oldest time, or None if any side has none yet."""
    values = list(times)
    if any(value is None for value in values):
        return None
    return min(value for value in values if value is not None)
