"""The discovery suite's measured side: a real `Fleet` and pod source, driven over stdin/stdout.

`python -m bench.discovery.programs.worker --kubeconfig K [--backoff-max S]
[--profile-dir D]`, started fresh per run by the driver (`scenario.Worker`). It
builds the pod source as `headcount serve --discovery k8s-pods` does
(`build_k8s_source`: lister-watcher, reflector, `PodSource`) on uvloop, without
engine probes, and answers one JSON command per stdin line with one JSON line on
stdout: `sync`, `relist_arm`/`relist_await`, `events_arm`/`events_await`,
`traced_sync`, `truth_arm`/`truth_await`, `quit`. Times are CLOCK_MONOTONIC, the
driver's clock too. What it wraps around the router to time it:
`bench/discovery/instruments.py`; with `--profile-dir`, each phase is cProfile'd
into a file there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import logging
import math
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import uvloop

from bench.common.harness import BenchError
from bench.discovery.instruments import (
    ListTimings,
    SnapshotReader,
    Tally,
    proc_status_kib,
    reset_peak_rss,
)
from bench.discovery.scenario import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    ENGINE_PORT,
    NAMESPACE,
    POLL_S,
    SELECTOR,
    SHORT_WATCH_S,
    SOURCE_NAME,
    JsonObject,
)
from headcount.config import DiscoveryMode, DiscoverySettings, ProbeSettings
from headcount.discovery.build import build_k8s_source
from headcount.discovery.source import SourceStatus
from headcount.fleet import Fleet
from headcount.sim.cluster import wait_until

__all__: list[str] = []


class _Router:
    """A fleet and its pod source, as `headcount serve --discovery k8s-pods` builds them."""

    def __init__(self, kubeconfig: Path, backoff_max: float, profile_dir: Path | None) -> None:
        self._kubeconfig = kubeconfig
        self._backoff_max = backoff_max
        self._profile_dir = profile_dir
        self._profile: cProfile.Profile | None = None
        self._phase = ""
        self._task: asyncio.Task[None] | None = None
        self._fleet = Fleet(unhealthy_after=ProbeSettings().unhealthy_after)
        self._status: SourceStatus | None = None
        self.tally = Tally(lambda: self._status.last_attempt_started if self._status else None)
        self._cpu_at_arm = 0.0
        self._expected_after_truth: frozenset[str] = frozenset()
        self._lists = ListTimings()
        self._lists.install()
        self._reader = SnapshotReader(self._fleet)

    # the source's life

    async def _start(self) -> float:
        """A fresh fleet and source; returns the monotonic time the source was started."""
        await self._stop()
        settings = DiscoverySettings(
            mode=DiscoveryMode.K8S_PODS,
            kubeconfig=self._kubeconfig,
            namespace=NAMESPACE,
            label_selector=SELECTOR,
            engine_port=ENGINE_PORT,
            backoff_initial=BACKOFF_INITIAL_S,
            backoff_max=self._backoff_max,
        )
        fleet = Fleet(unhealthy_after=ProbeSettings().unhealthy_after)
        source = await build_k8s_source(settings, fleet)
        fleet.subscribe(self.tally)
        self._reader = SnapshotReader(fleet)
        fleet.subscribe(self._reader)
        self._fleet, self._status = fleet, source.status
        self.tally.reset()
        started = time.monotonic()
        self._task = asyncio.create_task(source.run(), name="pod source")
        return started

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)

    def _live_status(self) -> SourceStatus:
        if self._status is None:
            raise BenchError("worker: no source started")
        return self._status

    def _engine_ids(self) -> frozenset[str]:
        return self._fleet.source_ids(SOURCE_NAME)

    async def _synced(self, expect: int) -> float:
        """Wait for the first LIST applied with `expect` engines; returns when it was applied."""
        status = self._live_status()
        await wait_until(
            lambda: status.synced, timeout=60, interval=POLL_S, what="the initial sync"
        )
        engines = len(self._engine_ids())
        if engines != expect:
            raise BenchError(f"synced with {engines} engines, expected {expect}")
        if status.last_list_success is None:
            raise BenchError("synced without a successful LIST")
        return status.last_list_success

    # profiling, per phase

    def _profile_on(self, phase: str) -> None:
        if self._profile_dir is not None:
            self._phase = phase
            self._profile = cProfile.Profile()
            self._profile.enable()

    def _profile_off(self) -> None:
        if self._profile is not None and self._profile_dir is not None:
            self._profile.disable()
            self._profile.dump_stats(self._profile_dir / f"{self._phase}.prof")
            self._profile = None

    # commands

    async def sync(self, expect: int) -> JsonObject:
        rss_before = proc_status_kib("VmRSS")
        reset_peak_rss()
        self._profile_on("sync")
        started = await self._start()
        synced_at = await self._synced(expect)
        self._profile_off()
        return {
            "sync_s": synced_at - started,
            "rss_peak_delta_kib": proc_status_kib("VmHWM") - rss_before,
            "rss_retained_kib": proc_status_kib("VmRSS") - rss_before,
            "list": self._lists.last(),
        }

    async def relist_arm(self) -> JsonObject:
        status = self._live_status()
        await wait_until(
            lambda: (
                status.watch_connected
                and time.monotonic() - (status.last_attempt_started or math.inf)
                > SHORT_WATCH_S + 0.2
            ),
            timeout=30,
            interval=POLL_S,
            what="a watch older than short_watch",
        )
        self.tally.reset()
        self._profile_on("relist")
        return {"relists": status.relists["watch-ended"]}

    async def relist_await(self, since: float, relists: int) -> JsonObject:
        status = self._live_status()
        await wait_until(
            lambda: (
                status.relists["watch-ended"] > relists and (status.last_list_success or 0) > since
            ),
            timeout=30,
            interval=POLL_S,
            what="the relist after the dropped watch",
        )
        self._profile_off()
        return {
            "applied_at": status.last_list_success,
            "list_started": self.tally.last_list_started,
            "list": self._lists.last(),
            **self.tally.counts(),
            "errors": status.relists["error"],
        }

    def events_arm(self, count: int, phase: str, reader: bool) -> JsonObject:
        self.tally.reset(lambda tally: tally.changed >= count)
        self._reader.reading = reader
        self._reader.rebuilds = 0
        self._reader.rebuild_s = 0.0
        self._cpu_at_arm = time.process_time()
        self._profile_on(phase)
        return {}

    async def events_await(self) -> JsonObject:
        await wait_until(
            lambda: self.tally.reached_at is not None,
            timeout=120,
            interval=POLL_S,
            what="the last watch event",
        )
        cpu = time.process_time() - self._cpu_at_arm
        self._profile_off()
        self._reader.reading = False
        return {
            "last_at": self.tally.reached_at,
            "cpu_s": cpu,
            "rebuilds": self._reader.rebuilds,
            "rebuild_s": self._reader.rebuild_s,
            **self.tally.counts(),
        }

    async def traced_sync(self, expect: int) -> JsonObject:
        await self._stop()
        tracemalloc.start()
        try:
            await self._start()
            await self._synced(expect)
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return {"traced_peak_bytes": peak, "traced_retained_bytes": current}

    def truth_arm(self, deleted: Sequence[str]) -> JsonObject:
        gone = frozenset(deleted)
        held = self._engine_ids()
        self._expected_after_truth = held - gone
        self.tally.reset(lambda tally: gone <= tally.removed_ids)
        self._profile_on("truth")
        return {"engines": len(held), "blind": gone <= held}

    async def truth_await(self) -> JsonObject:
        await wait_until(
            lambda: self.tally.reached_at is not None,
            timeout=60,
            interval=POLL_S,
            what="the fleet equal to the truth",
        )
        self._profile_off()
        return {
            "truth_at": self.tally.reached_at,
            "list_started": self.tally.list_started,
            "exact": self._engine_ids() == self._expected_after_truth,
            "list": self._lists.last(),
            **self.tally.counts(),
            "errors": self._live_status().relists["error"],
        }

    async def close(self) -> None:
        await self._stop()


async def _serve_commands(router: _Router) -> None:
    """One JSON command per stdin line, one JSON answer per stdout line, until `quit` or EOF."""
    handlers: dict[str, Callable[..., Awaitable[JsonObject] | JsonObject]] = {
        "sync": router.sync,
        "relist_arm": router.relist_arm,
        "relist_await": router.relist_await,
        "events_arm": router.events_arm,
        "events_await": router.events_await,
        "traced_sync": router.traced_sync,
        "truth_arm": router.truth_arm,
        "truth_await": router.truth_await,
    }
    try:
        while line := await asyncio.to_thread(sys.stdin.readline):
            request = json.loads(line)
            command = request.pop("cmd")
            if command == "quit":
                return
            try:
                answer = handlers[command](**request)
                if not isinstance(answer, dict):
                    answer = await answer
            except Exception as exc:
                logging.exception("worker: %s failed", command)
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)
    finally:
        await router.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kubeconfig", type=Path, required=True, help="the emulator's")
    parser.add_argument("--backoff-max", type=float, default=BACKOFF_MAX_S, help="seconds")
    parser.add_argument("--profile-dir", type=Path, help="cProfile each phase into this folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    router = _Router(args.kubeconfig, args.backoff_max, args.profile_dir)
    uvloop.run(_serve_commands(router))
    return 0


if __name__ == "__main__":
    sys.exit(main())
