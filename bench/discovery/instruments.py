"""What the discovery worker wraps around the router to time it, behaviour unchanged.

`Tally` counts what the fleet publishes and notes when a phase's goal first
holds; `ListTimings` times one LIST's pieces by wrapping four functions;
`GcClock` adds up the cyclic collector's runs; `SnapshotReader` reads the fleet's
snapshot once per loop turn that changed it, as request traffic does; and the
process's own memory from /proc (`VmHWM` reset through `clear_refs`).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common.harness import BenchError
from bench.common.procfs import status_kib
from bench.discovery.scenario import JsonObject
from headcount.discovery import kube, pods
from headcount.fleet import Fleet, FleetChange

__all__ = [
    "GcClock",
    "ListTimings",
    "SnapshotReader",
    "Tally",
    "proc_status_kib",
    "reset_peak_rss",
]


def proc_status_kib(field_name: str) -> int:
    kib = status_kib(field_name)
    if kib is None:
        raise BenchError(f"/proc/self/status has no {field_name}")
    return kib


def reset_peak_rss() -> None:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


class Tally:
    """Counts what the fleet publishes and notes when a goal first holds (at the change itself)."""

    def __init__(self, status_started: Callable[[], float | None]) -> None:
        self._status_started = status_started
        self.reset()

    def reset(self, goal: Callable[[Tally], bool] | None = None) -> None:
        self.added = self.changed = self.removed = self.to_probe = self.publishes = 0
        self.removed_ids: set[str] = set()
        self.goal = goal
        self.reached_at: float | None = None
        self.list_started: float | None = None
        """`last_attempt_started` when the goal was reached: the start of the LIST applying."""
        self.last_list_started: float | None = None
        """`last_attempt_started` at the latest publish (a reconcile: its LIST's start)."""

    def __call__(self, change: FleetChange) -> None:
        self.publishes += 1
        self.added += len(change.added)
        self.changed += len(change.changed)
        self.removed += len(change.removed)
        self.removed_ids.update(change.removed)
        self.to_probe += len(change.to_probe)
        self.last_list_started = self._status_started()
        if self.goal is not None and self.reached_at is None and self.goal(self):
            self.reached_at = time.monotonic()
            self.list_started = self._status_started()

    def counts(self) -> JsonObject:
        return {
            "added": self.added,
            "changed": self.changed,
            "removed": self.removed,
            "to_probe": self.to_probe,
            "publishes": self.publishes,
        }


class GcClock:
    """Seconds the cyclic garbage collector has run, from `gc.callbacks`."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._started


class ListTimings:
    """Where one LIST's time goes, from timers wrapped around four functions (no behaviour change).

    request = `KubeListerWatcher.list` minus the JSON parse in it (connect, the
    server building and sending the body); parse = `kube._parse_list`; map =
    `PodSource._on_list` minus `reconcile_listed` (pod_to_spec per pod); reconcile
    = `reconcile_listed` (Fleet.reconcile and its listeners); gc = the cyclic
    collector's runs during parse, map and reconcile.
    """

    def __init__(self) -> None:
        self.list_s = self.parse_s = self.on_list_s = self.reconcile_s = 0.0
        self.parse_gc_s = self.on_list_gc_s = 0.0
        self.body_bytes = 0
        self._gc = GcClock()

    def install(self) -> None:
        list_pods = kube.KubeListerWatcher.list
        parse_list = kube._parse_list
        on_list = pods.PodSource._on_list
        reconcile_listed = pods.reconcile_listed

        async def timed_list(lw: kube.KubeListerWatcher, selector: str) -> Any:
            started = time.perf_counter()
            try:
                return await list_pods(lw, selector)
            finally:
                self.list_s = time.perf_counter() - started

        def timed_parse(body: bytes, what: str) -> Any:
            started, gc_before = time.perf_counter(), self._gc.total_s
            try:
                return parse_list(body, what)
            finally:
                self.parse_s = time.perf_counter() - started
                self.parse_gc_s = self._gc.total_s - gc_before
                self.body_bytes = len(body)

        def timed_on_list(source: pods.PodSource, objects: Any) -> None:
            started, gc_before = time.perf_counter(), self._gc.total_s
            try:
                on_list(source, objects)
            finally:
                self.on_list_s = time.perf_counter() - started
                self.on_list_gc_s = self._gc.total_s - gc_before

        def timed_reconcile(*args: Any) -> None:
            started = time.perf_counter()
            try:
                reconcile_listed(*args)
            finally:
                self.reconcile_s = time.perf_counter() - started

        setattr(kube.KubeListerWatcher, "list", timed_list)  # noqa: B010
        setattr(kube, "_parse_list", timed_parse)  # noqa: B010
        setattr(pods.PodSource, "_on_list", timed_on_list)  # noqa: B010
        setattr(pods, "reconcile_listed", timed_reconcile)  # noqa: B010

    def last(self) -> JsonObject:
        """The pieces of the latest LIST, in seconds."""
        return {
            "request_s": self.list_s - self.parse_s,
            "parse_s": self.parse_s,
            "map_s": self.on_list_s - self.reconcile_s,
            "reconcile_s": self.reconcile_s,
            "gc_s": self.parse_gc_s + self.on_list_gc_s,
            "body_bytes": self.body_bytes,
        }


class SnapshotReader:
    """When on, reads `fleet.snapshot` once per loop turn that changed the fleet.

    That is what steady request traffic does (the proxy takes a snapshot per
    request), and a read after writes rebuilds the snapshot: O(N log N).
    """

    def __init__(self, fleet: Fleet) -> None:
        self.reading = False
        self.rebuilds = 0
        self.rebuild_s = 0.0
        self._fleet = fleet
        self._scheduled = False
        self._version = -1

    def __call__(self, change: FleetChange) -> None:
        if self.reading and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._read)

    def _read(self) -> None:
        self._scheduled = False
        started = time.perf_counter()
        version = self._fleet.snapshot.version
        if version != self._version:
            self.rebuild_s += time.perf_counter() - started
            self._version = version
            self.rebuilds += 1
