"""Measure Kubernetes discovery at scale: how fast the fleet learns the truth, and what it costs.

Method (the numbers are only as good as this):

- Three processes share the 2 cores: the API emulator (`python -m
  headcount.sim.apiserver`), the driver (this script: creates, patches and
  deletes pods through the emulator's admin API, injects faults, times them)
  and one *worker* per run (this module with `--worker`), the measured side: a
  real `Fleet` and the pod source from `build_k8s_source` (kubernetes_asyncio
  lister-watcher, reflector, `PodSource`) on uvloop, as `headcount serve` runs
  it. No Prober: engines stay `pending`, membership is what is measured. The
  driver and the worker talk over the worker's stdin/stdout (JSON lines);
  times on both sides are CLOCK_MONOTONIC, one clock for the whole machine.
- Pods are created once per size (bounded concurrency over HTTP), label
  `app=vllm` selected. Each run starts a fresh worker and measures, in order:
  1. initial sync: source started -> first LIST applied (`status.synced`,
     fleet holds N). RSS: VmHWM (reset through /proc/self/clear_refs) minus
     VmRSS before the start, in the fresh worker process.
  2. no-change relist: the watch has lived past `short_watch` (else a clean
     end is a very short watch and backs off); the driver ends every watch
     (`drop-watches`, a clean EOF) and the time runs to the relist's LIST being
     applied (`relists[watch-ended]` +1, `last_list_success` past the drop).
     Every `FleetChange.to_probe` in that window is counted: it must be 0.
  3. watch events/s, M label changes (`model`, so each one is a changed
     engine), two ways: *burst*: the watch is stalled, the M patches queue in
     the emulator, then `restore` and the clock runs to the M-th change applied
     (the router's drain rate; its CPU share says whether it was the limit);
     *live*: the driver sends the M patches as fast as it can (16 in flight)
     and the clock runs from the first sent to the M-th applied (end to end).
     Each again *with a reader*: `fleet.snapshot` read once per loop turn that
     changed the fleet, as request traffic does (a read after a write rebuilds
     the snapshot, O(N log N)).
  4. tracemalloc peak: a second fresh fleet and source synced under
     tracemalloc (its timing is not reported: tracing slows Python ~3x).
  5. time to truth after a blind period: the watch is stalled, 10% of the
     pods are deleted (the DELETED events queue in the emulator and are never
     sent), then the server refuses connections for S seconds (which aborts
     the stalled watch: the queued events are lost, the router is blind to
     the deletions); it restores itself. The driver polls TCP connects to time
     the API reachable again; the clock runs to the fleet equal to the truth
     (all deleted engines removed by the relist). Back-off: production's
     initial 0.8 s, `backoff_max` scaled down from 30 s to 1 s. S is drawn in
     [2.5, 3.5] s so the retry phase is not the same every run.
- Where a LIST's time goes: the worker wraps `KubeListerWatcher.list`,
  `kube._parse_list`, `PodSource._on_list` and `pods.reconcile_listed` with
  timers (behaviour unchanged) and counts the cyclic GC's time (`gc.callbacks`).
- Medians over `--runs` runs. `--profile` adds one cProfile'd run at the
  largest size and prints where the worker's time went, per phase.
  `--backoff-max 30` measures time to truth with production's back-off.

Usage: `.venv/bin/python -m bench.discovery [--sizes 100,1000,5000] [--runs 3]
[--events 2000] [--quick] [--profile] [--backoff-max S]`. The report is printed and written to
`bench/out/discovery-<timestamp>.md`, logs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime
import gc
import io
import json
import logging
import math
import os
import platform
import pstats
import random
import signal
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench.common.harness import OUT, BenchError
from bench.common.processes import Proc, Processes
from bench.common.procfs import status_kib, tree_cpu_seconds
from headcount.config import DiscoveryMode, DiscoverySettings, ProbeSettings
from headcount.discovery import kube, pods
from headcount.discovery.build import build_k8s_source
from headcount.discovery.reflector import ReflectorTiming
from headcount.discovery.source import SourceStatus
from headcount.fleet import Fleet, FleetChange
from headcount.sim.apiserver import make_pod
from headcount.sim.cluster import wait_until
from headcount.sim.loopback import free_port

__all__ = ["Goals", "RunResult", "main"]

NAMESPACE = "default"
SELECTOR = "app=vllm"
SOURCE_NAME = "k8s-pods"
ENGINE_PORT = 8000
BACKOFF_INITIAL_S = DiscoverySettings().backoff_initial
BACKOFF_MAX_S = 1.0
"""Production's 30 s scaled down, so a blind period costs seconds, not half a minute."""
SHORT_WATCH_S = ReflectorTiming.short_watch
"""A watch that ends sooner without an event is an error and backs off."""
DRIVER_CONCURRENCY = 16
EVENTS = 2000
DELETE_FRACTION = 0.1
REFUSE_RANGE_S = (2.5, 3.5)
HTTP_TIMEOUT_S = 30.0
ASK_TIMEOUT_S = 120.0
POLL_S = 0.002
MIB = 1024.0 * 1024.0

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Goals:
    """The issue's targets, in seconds."""

    sync_s: float = 2.0
    sync_size: int = 5000
    relist_s: float = 0.5
    truth_s: float = 1.0


# --- the worker: the measured side --------------------------------------------------------------


def _proc_status_kib(field_name: str) -> int:
    kib = status_kib(field_name)
    if kib is None:
        raise BenchError(f"/proc/self/status has no {field_name}")
    return kib


def _reset_peak_rss() -> None:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


class _Tally:
    """Counts what the fleet publishes and notes when a goal first holds (at the change itself)."""

    def __init__(self, status_started: Callable[[], float | None]) -> None:
        self._status_started = status_started
        self.reset()

    def reset(self, goal: Callable[[_Tally], bool] | None = None) -> None:
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


class _GcClock:
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


class _ListTimings:
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
        self._gc = _GcClock()

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


class _SnapshotReader:
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
        self.tally = _Tally(lambda: self._status.last_attempt_started if self._status else None)
        self._cpu_at_arm = 0.0
        self._expected_after_truth: frozenset[str] = frozenset()
        self._lists = _ListTimings()
        self._lists.install()
        self._reader = _SnapshotReader(self._fleet)

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
        self._reader = _SnapshotReader(fleet)
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
        rss_before = _proc_status_kib("VmRSS")
        _reset_peak_rss()
        self._profile_on("sync")
        started = await self._start()
        synced_at = await self._synced(expect)
        self._profile_off()
        return {
            "sync_s": synced_at - started,
            "rss_peak_delta_kib": _proc_status_kib("VmHWM") - rss_before,
            "rss_retained_kib": _proc_status_kib("VmRSS") - rss_before,
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


def _worker_main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    router = _Router(args.kubeconfig, args.backoff_max, args.profile_dir)
    uvloop.run(_serve_commands(router))


# --- the driver ---------------------------------------------------------------------------------


class _Worker:
    """A worker process and its command pipe; killed with its process group on close."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self._process = process
        self._log_path = log_path

    @classmethod
    async def start(
        cls, kubeconfig: Path, backoff_max: float, log_path: Path, profile_dir: Path | None
    ) -> _Worker:
        argv = [sys.executable, "-m", "bench.discovery", "--worker"]
        argv += ["--kubeconfig", str(kubeconfig), "--backoff-max", str(backoff_max)]
        if profile_dir is not None:
            argv += ["--profile-dir", str(profile_dir)]
        with log_path.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        return cls(process, log_path)

    async def ask(
        self, command: str, timeout_s: float = ASK_TIMEOUT_S, **fields: Any
    ) -> JsonObject:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps({"cmd": command, **fields}).encode() + b"\n")
        try:
            await asyncio.wait_for(stdin.drain(), timeout_s)
            line = await asyncio.wait_for(stdout.readline(), timeout_s)
        except (TimeoutError, ConnectionError) as exc:
            raise BenchError(f"worker: no answer to {command}: {exc!r}{self._tail()}") from exc
        if not line:
            raise BenchError(f"worker exited during {command}{self._tail()}")
        answer: JsonObject = json.loads(line)
        if "error" in answer:
            raise BenchError(f"worker: {command}: {answer['error']}{self._tail()}")
        return answer

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n" + "\n".join(self._log_path.read_text().splitlines()[-15:])
        return ""

    async def close(self) -> None:
        process = self._process
        if process.returncode is None and process.stdin is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                process.stdin.write(b'{"cmd": "quit"}\n')
                process.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 10)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if process.returncode is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 5)


class _Cluster:
    """The emulator process, reached through its admin API; knows every pod's name and uid."""

    def __init__(self, proc: Proc, port: int, kubeconfig: Path, session: aiohttp.ClientSession):
        self.proc = proc
        self.port = port
        self.kubeconfig = kubeconfig
        self._session = session
        self._base = f"http://127.0.0.1:{port}"
        self.uids: dict[str, str] = {}
        self._ips = 0

    async def call(self, method: str, path: str, body: JsonObject | None = None) -> JsonObject:
        async with self._session.request(method, self._base + path, json=body) as response:
            answer: JsonObject = await response.json(content_type=None)
            if response.status >= 300:
                raise BenchError(f"{method} {path}: HTTP {response.status}: {answer}")
            return answer

    async def fault(self, name: str, **options: Any) -> None:
        await self.call("POST", f"/_sim/faults/{name}", options)

    async def create(self, names: Iterable[str]) -> None:
        async def one(name: str) -> None:
            self._ips += 1
            ip = f"127.{1 + self._ips // 65536}.{self._ips // 256 % 256}.{self._ips % 256}"
            pod = make_pod(name, namespace=NAMESPACE, labels={"app": "vllm", "model": "m-0"}, ip=ip)
            stored = await self.call("PUT", "/_sim/objects", pod)
            self.uids[name] = stored["metadata"]["uid"]

        await _bounded([one(name) for name in names])

    async def relabel(self, names: Sequence[str], count: int, tag: str) -> None:
        """`count` patches of the `model` label, round robin over `names`, each a new value."""

        async def one(i: int) -> None:
            name = names[i % len(names)]
            patch = {"metadata": {"labels": {"model": f"m-{tag}-{i}"}}}
            await self.call("PATCH", f"/_sim/objects/pods/{NAMESPACE}/{name}", patch)

        await _bounded([one(i) for i in range(count)])

    async def delete(self, names: Sequence[str]) -> list[str]:
        async def one(name: str) -> None:
            await self.call("DELETE", f"/_sim/objects/pods/{NAMESPACE}/{name}")

        await _bounded([one(name) for name in names])
        return [self.uids.pop(name) for name in names]

    async def wait_refused_then_reachable(self, timeout_s: float) -> float:
        """The monotonic time of the first accepted connection after one was refused."""
        deadline = time.monotonic() + timeout_s
        refused = False
        while time.monotonic() < deadline:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), 0.5
                )
            except (OSError, TimeoutError):
                refused = True
            else:
                reachable_at = time.monotonic()
                writer.close()
                if refused:
                    return reachable_at
            await asyncio.sleep(POLL_S)
        raise BenchError(f"the API was not refused, then reachable, within {timeout_s:g} s")


async def _bounded(jobs: Sequence[Awaitable[None]], limit: int = DRIVER_CONCURRENCY) -> None:
    gate = asyncio.Semaphore(limit)

    async def gated(job: Awaitable[None]) -> None:
        async with gate:
            await job

    await asyncio.gather(*(gated(job) for job in jobs))


@contextlib.asynccontextmanager
async def _emulator(procs: Processes, log_dir: Path, size: int) -> Any:
    port = free_port()
    kubeconfig = log_dir / f"kubeconfig-{size}"
    proc = procs.start(
        f"apiserver-{size}",
        [
            sys.executable,
            "-m",
            "headcount.sim.apiserver",
            "--port",
            str(port),
            "--kubeconfig-out",
            str(kubeconfig),
        ],
    )
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=DRIVER_CONCURRENCY)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            cluster = _Cluster(proc, port, kubeconfig, session)
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    await cluster.call("GET", "/_sim/state")
                    if kubeconfig.is_file():
                        break
                if not proc.alive() or time.monotonic() > deadline:
                    raise BenchError(f"the emulator did not come up:\n{proc.log_tail()}")
                await asyncio.sleep(0.05)
            yield cluster
    finally:
        procs.stop(proc)


@dataclass(frozen=True)
class ListPieces:
    """Where one LIST's time went in the worker (see `_ListTimings`), in seconds."""

    request_s: float
    parse_s: float
    map_s: float
    reconcile_s: float
    gc_s: float
    """Of parse + map + reconcile, the cyclic GC's share."""
    body_mib: float

    @classmethod
    def from_answer(cls, answer: JsonObject) -> ListPieces:
        return cls(
            answer["request_s"],
            answer["parse_s"],
            answer["map_s"],
            answer["reconcile_s"],
            answer["gc_s"],
            answer["body_bytes"] / MIB,
        )


@dataclass(frozen=True)
class SyncResult:
    seconds: float
    rss_peak_mib: float
    """VmHWM after the sync minus VmRSS before it, in a fresh worker process."""
    rss_retained_mib: float
    traced_peak_mib: float
    traced_retained_mib: float
    pieces: ListPieces


@dataclass(frozen=True)
class RelistResult:
    seconds: float
    """Watch dropped -> the relist's LIST applied."""
    to_probe: int
    changes: int
    """Engines added, changed or removed by the relist: 0 when nothing changed."""
    error_relists: int
    pieces: ListPieces


@dataclass(frozen=True)
class Burst:
    """M events queued behind a stalled watch, then released at once."""

    per_s: float
    router_us_per_event: float
    """Worker CPU per event: the steadiest number; 1e6 / it is the router's ceiling."""
    router_cpu: float
    """Worker CPU seconds / wall seconds: near 1 means the router was the limit."""
    emulator_cpu: float
    rebuilds: int
    """Snapshot rebuilds, when a reader ran."""


@dataclass(frozen=True)
class Live:
    """M patches sent as fast as the driver can, each event reaching the router as it happens."""

    per_s: float
    sent_per_s: float
    """How fast the driver got the emulator to take the patches: the ceiling for `per_s`."""
    lag_s: float
    """Last patch answered -> last change applied: how far behind the router was."""
    rebuilds: int
    rebuild_ms: float
    """Mean cost of one snapshot rebuild, when a reader ran."""


@dataclass(frozen=True)
class EventsResult:
    burst: Burst
    burst_read: Burst
    """With a snapshot read per loop turn that changed the fleet (as under request traffic)."""
    live: Live
    live_read: Live


@dataclass(frozen=True)
class TruthResult:
    refused_s: float
    seconds: float
    """API reachable again -> the fleet equal to the truth."""
    wait_s: float
    """Reachable -> the LIST that found the truth started: the back-off's share."""
    apply_s: float
    """That LIST's start -> the truth applied."""
    pieces: ListPieces
    blind: bool
    """Before the refusal, the fleet still held every deleted pod: the router was blind."""
    exact: bool
    """After it, the fleet's engines are exactly the pods left."""


@dataclass(frozen=True)
class RunResult:
    """One run at one size."""

    size: int
    sync: SyncResult
    relist: RelistResult
    events: EventsResult
    truth: TruthResult


async def _measure_relist(cluster: _Cluster, worker: _Worker) -> RelistResult:
    armed = await worker.ask("relist_arm")
    dropped_at = time.monotonic()
    await cluster.fault("drop-watches")
    relist = await worker.ask("relist_await", since=dropped_at, relists=armed["relists"])
    return RelistResult(
        seconds=relist["applied_at"] - dropped_at,
        to_probe=relist["to_probe"],
        changes=relist["added"] + relist["changed"] + relist["removed"],
        error_relists=relist["errors"],
        pieces=ListPieces.from_answer(relist["list"]),
    )


async def _burst(cluster: _Cluster, worker: _Worker, events: int, tag: str, reader: bool) -> Burst:
    await cluster.fault("stall")
    await cluster.relabel(sorted(cluster.uids), events, tag)
    await worker.ask("events_arm", count=events, phase=f"burst{'-read' * reader}", reader=reader)
    emulator_cpu = tree_cpu_seconds(cluster.proc.pid)
    restored_at = time.monotonic()
    await cluster.fault("restore")
    burst = await worker.ask("events_await")
    seconds = burst["last_at"] - restored_at
    emulator_cpu = tree_cpu_seconds(cluster.proc.pid) - emulator_cpu
    return Burst(
        per_s=events / seconds,
        router_us_per_event=burst["cpu_s"] / events * 1e6,
        router_cpu=burst["cpu_s"] / seconds,
        emulator_cpu=emulator_cpu / seconds,
        rebuilds=burst["rebuilds"],
    )


async def _live(cluster: _Cluster, worker: _Worker, events: int, tag: str, reader: bool) -> Live:
    await worker.ask("events_arm", count=events, phase=f"live{'-read' * reader}", reader=reader)
    sent_from = time.monotonic()
    await cluster.relabel(sorted(cluster.uids), events, tag)
    sent_at = time.monotonic()
    live = await worker.ask("events_await")
    return Live(
        per_s=events / (live["last_at"] - sent_from),
        sent_per_s=events / (sent_at - sent_from),
        lag_s=live["last_at"] - sent_at,
        rebuilds=live["rebuilds"],
        rebuild_ms=live["rebuild_s"] / max(1, live["rebuilds"]) * 1000,
    )


async def _measure_events(
    cluster: _Cluster, worker: _Worker, events: int, rng: random.Random
) -> EventsResult:
    def tag(kind: str) -> str:
        return f"{kind}{rng.randrange(10**9)}"

    return EventsResult(
        burst=await _burst(cluster, worker, events, tag("b"), reader=False),
        burst_read=await _burst(cluster, worker, events, tag("br"), reader=True),
        live=await _live(cluster, worker, events, tag("l"), reader=False),
        live_read=await _live(cluster, worker, events, tag("lr"), reader=True),
    )


async def _measure_truth(
    cluster: _Cluster, worker: _Worker, size: int, rng: random.Random
) -> TruthResult:
    await cluster.fault("stall")
    doomed = rng.sample(sorted(cluster.uids), max(1, round(size * DELETE_FRACTION)))
    deleted = await cluster.delete(doomed)
    armed = await worker.ask("truth_arm", deleted=deleted)
    refuse_s = round(rng.uniform(*REFUSE_RANGE_S), 3)
    await cluster.fault("refuse", seconds=refuse_s)
    reachable_at = await cluster.wait_refused_then_reachable(refuse_s + 10)
    truth = await worker.ask("truth_await")
    await cluster.create(doomed)
    return TruthResult(
        refused_s=refuse_s,
        seconds=truth["truth_at"] - reachable_at,
        wait_s=truth["list_started"] - reachable_at,
        apply_s=truth["truth_at"] - truth["list_started"],
        pieces=ListPieces.from_answer(truth["list"]),
        blind=armed["blind"] and armed["engines"] == size,
        exact=truth["exact"],
    )


async def _measure_run(
    cluster: _Cluster, worker: _Worker, size: int, events: int, rng: random.Random
) -> RunResult:
    """Every phase, in the order the docstring gives."""
    sync = await worker.ask("sync", expect=size)
    relist = await _measure_relist(cluster, worker)
    events_result = await _measure_events(cluster, worker, events, rng)
    traced = await worker.ask("traced_sync", expect=size)
    truth = await _measure_truth(cluster, worker, size, rng)
    sync_result = SyncResult(
        seconds=sync["sync_s"],
        rss_peak_mib=sync["rss_peak_delta_kib"] / 1024,
        rss_retained_mib=sync["rss_retained_kib"] / 1024,
        traced_peak_mib=traced["traced_peak_bytes"] / MIB,
        traced_retained_mib=traced["traced_retained_bytes"] / MIB,
        pieces=ListPieces.from_answer(sync["list"]),
    )
    return RunResult(size, sync_result, relist, events_result, truth)


@dataclass(frozen=True)
class _Plan:
    """What every size gets: how many runs, how many events, which back-off, where logs go."""

    runs: int
    events: int
    backoff_max: float
    log_dir: Path
    profile_size: int | None
    """The size that gets one more, cProfile'd, run; None: no profiling."""

    def profile_dir(self, size: int) -> Path:
        return self.log_dir / f"profile-{size}"


async def _measure_size(
    procs: Processes, plan: _Plan, size: int, rng: random.Random
) -> list[RunResult]:
    """Every run at one size, against one emulator holding `size` pods."""
    results: list[RunResult] = []
    async with _emulator(procs, plan.log_dir, size) as cluster:
        loaded_from = time.monotonic()
        await cluster.create(f"engine-{i:05d}" for i in range(size))
        print(f"  {size} pods created in {time.monotonic() - loaded_from:.1f} s", flush=True)
        for run in range(plan.runs + (plan.profile_size == size)):
            profiled = run == plan.runs
            log_path = plan.log_dir / f"worker-{size}-{'profile' if profiled else run}.log"
            profile_dir = plan.profile_dir(size) if profiled else None
            if profile_dir is not None:
                profile_dir.mkdir(parents=True, exist_ok=True)
            worker = await _Worker.start(
                cluster.kubeconfig, plan.backoff_max, log_path, profile_dir
            )
            try:
                result = await _measure_run(cluster, worker, size, plan.events, rng)
            finally:
                await worker.close()
            label = "profiled run" if profiled else f"run {run + 1}/{plan.runs}"
            print(f"  {label}: {_one_line(result)}", flush=True)
            if not profiled:
                results.append(result)
    return results


def _one_line(r: RunResult) -> str:
    return (
        f"sync {r.sync.seconds:.3f} s, relist {r.relist.seconds:.3f} s "
        f"({r.relist.to_probe} to probe), burst {r.events.burst.per_s:,.0f} ev/s "
        f"(with reader {r.events.burst_read.per_s:,.0f}), live {r.events.live.per_s:,.0f} ev/s "
        f"(with reader {r.events.live_read.per_s:,.0f}), truth {r.truth.seconds:.3f} s "
        f"(wait {r.truth.wait_s:.3f} + LIST→applied {r.truth.apply_s:.3f})"
    )


# --- the report ---------------------------------------------------------------------------------


def _median(values: Iterable[float]) -> float:
    return statistics.median(values)


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _summary_table(by_size: dict[int, list[RunResult]]) -> list[str]:
    lines = [
        "| pods | initial sync | tracemalloc peak / retained | RSS peak Δ / retained "
        "| no-change relist | engines to probe on relist | time to truth (back-off wait + "
        "LIST→applied) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, runs in by_size.items():
        sync = [r.sync for r in runs]
        truth = [r.truth for r in runs]
        lines.append(
            f"| {size:,} | {_median(s.seconds for s in sync):.3f} s "
            f"| {_median(s.traced_peak_mib for s in sync):.1f} / "
            f"{_median(s.traced_retained_mib for s in sync):.1f} MiB "
            f"| {_median(s.rss_peak_mib for s in sync):.1f} / "
            f"{_median(s.rss_retained_mib for s in sync):.1f} MiB "
            f"| {_median(r.relist.seconds for r in runs):.3f} s "
            f"| {max(r.relist.to_probe for r in runs)} "
            f"| {_median(t.seconds for t in truth):.3f} s "
            f"({_median(t.wait_s for t in truth):.3f} + {_median(t.apply_s for t in truth):.3f}) |"
        )
    return lines


def _events_table(by_size: dict[int, list[RunResult]]) -> list[str]:
    lines = [
        "| pods | burst events/s | router CPU per event | router / emulator CPU share "
        "| burst + reader events/s (rebuilds) | live events/s (driver sent/s, lag) "
        "| live + reader events/s (lag, rebuilds of ms each) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, runs in by_size.items():
        burst = [r.events.burst for r in runs]
        burst_read = [r.events.burst_read for r in runs]
        live = [r.events.live for r in runs]
        live_read = [r.events.live_read for r in runs]
        lines.append(
            f"| {size:,} | {_median(b.per_s for b in burst):,.0f} "
            f"| {_median(b.router_us_per_event for b in burst):.0f} µs "
            f"| {_median(b.router_cpu for b in burst):.0%} / "
            f"{_median(b.emulator_cpu for b in burst):.0%} "
            f"| {_median(b.per_s for b in burst_read):,.0f} "
            f"({_median(b.rebuilds for b in burst_read):.0f}) "
            f"| {_median(v.per_s for v in live):,.0f} "
            f"({_median(v.sent_per_s for v in live):,.0f}, "
            f"{_median(v.lag_s for v in live) * 1000:.0f} ms) "
            f"| {_median(v.per_s for v in live_read):,.0f} "
            f"({_median(v.lag_s for v in live_read) * 1000:.0f} ms, "
            f"{_median(v.rebuilds for v in live_read):.0f} of "
            f"{_median(v.rebuild_ms for v in live_read):.1f} ms) |"
        )
    return lines


def _pieces_table(by_size: dict[int, list[RunResult]]) -> list[str]:
    lines = [
        "| pods | LIST of | body | request (connect, server, transfer) | JSON parse "
        "| map (pod_to_spec) | reconcile | total | router's share (parse+map+reconcile) "
        "| of which cyclic GC |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    phases: tuple[tuple[str, Callable[[RunResult], ListPieces]], ...] = (
        ("initial sync", lambda r: r.sync.pieces),
        ("no-change relist", lambda r: r.relist.pieces),
        ("truth (10% gone)", lambda r: r.truth.pieces),
    )
    for size, runs in by_size.items():
        for phase, pick in phases:
            pieces = [pick(r) for r in runs]
            parts = [
                _median(p.request_s for p in pieces),
                _median(p.parse_s for p in pieces),
                _median(p.map_s for p in pieces),
                _median(p.reconcile_s for p in pieces),
            ]
            cells = " | ".join(f"{part * 1000:.1f} ms" for part in parts)
            lines.append(
                f"| {size:,} | {phase} | {_median(p.body_mib for p in pieces):.2f} MiB "
                f"| {cells} | {sum(parts) * 1000:.1f} ms | {sum(parts[1:]) * 1000:.1f} ms "
                f"| {_median(p.gc_s for p in pieces) * 1000:.1f} ms |"
            )
    return lines


def _goal_lines(by_size: dict[int, list[RunResult]], goals: Goals) -> list[str]:
    lines: list[str] = []
    big = by_size.get(goals.sync_size)
    if big is None:
        lines.append(f"- {goals.sync_size:,}-pod initial sync: not measured (size not run)")
    else:
        sync = _median(r.sync.seconds for r in big)
        lines.append(
            f"- {goals.sync_size:,}-pod initial sync < {goals.sync_s:g} s (no probes): "
            f"{sync:.3f} s, {_verdict(sync < goals.sync_s)}"
        )
    for size, runs in by_size.items():
        relist = _median(r.relist.seconds for r in runs)
        touched = max(r.relist.to_probe + r.relist.changes for r in runs)
        truth = _median(r.truth.seconds for r in runs)
        worst = max(r.truth.seconds for r in runs)
        checked = all(r.truth.blind and r.truth.exact for r in runs)
        lines.append(
            f"- {size:,} pods: no-change relist < {goals.relist_s:g} s with 0 probes: "
            f"{relist:.3f} s, {touched} engine(s) touched, "
            f"{_verdict(relist < goals.relist_s and touched == 0)}; "
            f"time to truth < {goals.truth_s:g} s: median {truth:.3f} s, "
            f"{_verdict(truth < goals.truth_s)}"
            + (f" (worst run {worst:.3f} s: over)" if worst >= goals.truth_s else "")
            + ("" if checked else "; **a blind-period check failed (see every run)**")
        )
    return lines


def _runs_table(by_size: dict[int, list[RunResult]]) -> list[str]:
    lines = [
        "| pods | run | sync s | relist s | relist errors | burst ev/s | router / emulator CPU "
        "| burst+reader ev/s | live ev/s | sent ev/s | lag ms | live+reader ev/s | refused s "
        "| truth s | wait s | LIST→applied s | blind | exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for size, runs in by_size.items():
        for i, r in enumerate(runs, 1):
            e, t = r.events, r.truth
            lines.append(
                f"| {size:,} | {i} | {r.sync.seconds:.3f} | {r.relist.seconds:.3f} "
                f"| {r.relist.error_relists} | {e.burst.per_s:,.0f} "
                f"| {e.burst.router_cpu:.0%} / {e.burst.emulator_cpu:.0%} "
                f"| {e.burst_read.per_s:,.0f} | {e.live.per_s:,.0f} | {e.live.sent_per_s:,.0f} "
                f"| {e.live.lag_s * 1000:.0f} | {e.live_read.per_s:,.0f} | {t.refused_s:.2f} "
                f"| {t.seconds:.3f} | {t.wait_s:.3f} | {t.apply_s:.3f} "
                f"| {t.blind} | {t.exact} |"
            )
    return lines


def _profile_section(profile_dir: Path, size: int, top: int = 18) -> list[str]:
    lines = [f"## Profile (one cProfile'd run at {size:,} pods; times inflated by profiling)", ""]
    for phase in ("sync", "relist", "burst", "burst-read", "live", "live-read", "truth"):
        path = profile_dir / f"{phase}.prof"
        if not path.is_file():
            continue
        text = io.StringIO()
        stats = pstats.Stats(str(path), stream=text)
        stats.strip_dirs().sort_stats("tottime").print_stats(top)
        body = text.getvalue()
        start = body.find("   ncalls")
        lines += [
            f"### {phase}: top {top} by own time",
            "",
            "```",
            body[start:].rstrip(),
            "```",
            "",
        ]
    return lines


_READING = (
    "How to read: *time to truth* = back-off wait (API reachable again -> the next LIST "
    "starts: where the retry timer happened to be, between 0 and the current back-off, "
    "so a few runs give a noisy median) + LIST→applied (the code's cost). *request* "
    "includes the emulator (Python) building and sending the body; the router's own cost "
    "is parse + map + reconcile. A *reader* reads `fleet.snapshot` once per loop turn "
    "that changed the fleet, as request traffic does; each read after a write rebuilds "
    "the snapshot.",
)


def _report(
    by_size: dict[int, list[RunResult]],
    args: argparse.Namespace,
    elapsed_s: float,
    profile: list[str],
) -> str:
    lines = [
        f"# Discovery benchmark — {datetime.datetime.now().isoformat(timespec='seconds')}",
        "",
        f"Medians of {args.runs} run(s). {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, worker on uvloop; emulator, driver and worker are "
        f"separate processes. {args.events} label changes per events phase. Back-off "
        f"{BACKOFF_INITIAL_S:g} s initial, max {args.backoff_max:g} s (production default: "
        f"30 s). Load average at the start: {args.load_at_start}. Whole run: {elapsed_s:.0f} s. "
        "Method: the docstring of bench/discovery/__main__.py.",
        "",
        *_READING,
        "",
        *_summary_table(by_size),
        "",
        "## Goals",
        "",
        *_goal_lines(by_size, Goals()),
        "",
        "## Watch events (medians)",
        "",
        *_events_table(by_size),
        "",
        "## Where a LIST's time goes (medians; request includes the emulator building the body)",
        "",
        *_pieces_table(by_size),
        "",
        "## Every run",
        "",
        *_runs_table(by_size),
        "",
        *profile,
    ]
    return "\n".join(lines).rstrip() + "\n"


# --- command line -------------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.discovery", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--sizes", default="100,1000,5000", help="pod counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs per size (median reported)")
    parser.add_argument("--events", type=int, default=EVENTS, help="label changes per run")
    parser.add_argument(
        "--quick", action="store_true", help="sizes 100,1000, one run, 500 events: a smoke run"
    )
    parser.add_argument(
        "--profile", action="store_true", help="add one cProfile'd run at the largest size"
    )
    parser.add_argument(
        "--backoff-max",
        type=float,
        default=BACKOFF_MAX_S,
        help="the reflector's back-off ceiling in seconds (production: 30)",
    )
    parser.add_argument("--seed", type=int, default=1, help="for the pods deleted and S")
    parser.add_argument("--out", type=Path, default=OUT, help="report directory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--profile-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.runs, args.events = "100,1000", 1, 500
    try:
        args.size_list = sorted({int(size) for size in args.sizes.split(",") if size.strip()})
    except ValueError:
        parser.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if not args.size_list or min(args.size_list) < 10 or args.runs < 1 or args.events < 1:
        parser.error("need sizes >= 10, --runs >= 1, --events >= 1")
    return args


async def _bench(
    args: argparse.Namespace, log_dir: Path
) -> tuple[dict[int, list[RunResult]], list[str]]:
    plan = _Plan(
        runs=args.runs,
        events=args.events,
        backoff_max=args.backoff_max,
        log_dir=log_dir,
        profile_size=max(args.size_list) if args.profile else None,
    )
    rng = random.Random(args.seed)
    by_size: dict[int, list[RunResult]] = {}
    with Processes(log_dir) as procs:
        for size in args.size_list:
            print(f"{size} pods:", flush=True)
            by_size[size] = await _measure_size(procs, plan, size, rng)
    if plan.profile_size is None:
        return by_size, []
    return by_size, _profile_section(plan.profile_dir(plan.profile_size), plan.profile_size)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.worker:
        _worker_main(args)
        return 0
    args.load_at_start = " ".join(f"{load:.2f}" for load in os.getloadavg())
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"discovery-{stamp}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        by_size, profile = uvloop.run(_bench(args, log_dir))
    except BenchError as error:
        print(f"discovery bench failed: {error}", file=sys.stderr)
        return 1
    report = _report(by_size, args, time.monotonic() - started, profile)
    report_path = args.out / f"discovery-{stamp}.md"
    report_path.write_text(report)
    print()
    print(report)
    print(f"report: {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
