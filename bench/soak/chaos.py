"""The soak's chaos: engine processes on pod IPs, and a seeded schedule that breaks them.

Each engine is a `python -m headcount.sim.engine` process on its own loopback
address with a pod for it in the API emulator. A seeded schedule starts a fault
every few seconds, each a coroutine that always ends by healing what it broke:

- `kill`: SIGKILL the engine; its pod is deleted a moment later (as the kubelet
  notices); after a while a new process and a new pod (new uid) take its place;
- `restart`: the pod turns NotReady, the engine gets SIGTERM, then starts again
  and the same pod turns Ready (a container restart);
- `hang`: the engine stops answering anything (`/sim/fail-mode hang`) for longer than
  a client waits, sometimes; then it recovers by itself, or (half the time) the
  kubelet's liveness probe gives up and its container is restarted;
- `flap`: the pod turns NotReady and Ready a few times, the engine untouched;
- `blackhole`: the API server accepts connections and answers nothing, then is
  restored; the time the router then takes to match the truth is recorded.

An engine fault only picks an engine that is healthy, and only while at least
two are, so a healthy engine exists throughout. "Healthy" is as the router could
know it: an engine counts again `settle` seconds after it recovered and the API
server answers. `Timeline` keeps these intervals; a failed request is excused
only if, at some moment of its life, no engine was healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.common.harness import BenchError
from bench.common.processes import Proc, Processes
from headcount.sim.cluster import SimCluster, wait_until

__all__ = ["Chaos", "ChaosSettings", "Slot", "Timeline", "covered"]


def covered(intervals: list[tuple[float, float | None]], start: float, end: float) -> bool:
    """Whether the union of `intervals` ([from, to), to None: still open) covers [start, end]."""
    reach = start
    for begin, finish in sorted(intervals, key=lambda interval: interval[0]):
        if begin > reach:
            return False
        if finish is None or finish >= end:
            return True
        reach = max(reach, finish)
    return False


class Timeline:
    """When each engine was healthy as the router could know it, and when the API was dark."""

    def __init__(self) -> None:
        self.intervals: dict[str, list[tuple[float, float | None]]] = {}
        self.outages: list[tuple[float, float]] = []

    def up(self, name: str, at: float) -> None:
        self.intervals.setdefault(name, []).append((at, None))

    def down(self, name: str, at: float) -> None:
        spans = self.intervals.get(name, [])
        if spans and spans[-1][1] is None:
            spans[-1] = (spans[-1][0], at)

    def healthy_engine_existed(self, start: float, end: float) -> bool:
        """Whether at every moment of [start, end] some engine was healthy: a router that
        fails over had somewhere to send the request all along."""
        spans = [span for engine in self.intervals.values() for span in engine]
        return covered(spans, start, end)


@dataclass(frozen=True)
class ChaosSettings:
    gap_s: tuple[float, float] = (3.0, 8.0)
    """Between two fault starts."""
    weights: tuple[tuple[str, int], ...] = (
        ("kill", 3),
        ("restart", 2),
        ("hang", 2),
        ("flap", 2),
        ("blackhole", 1),
    )
    down_s: tuple[float, float] = (3.0, 10.0)
    """How long a killed engine stays away."""
    hang_s: tuple[float, float] = (5.0, 40.0)
    """How long a hung engine hangs: up to past the clients' timeout (30 s)."""
    flap_s: tuple[float, float] = (0.3, 1.5)
    flaps: tuple[int, int] = (3, 6)
    blackhole_s: tuple[float, float] = (5.0, 20.0)
    blackhole_spacing_s: float = 15.0
    settle_s: float = 3.0
    """After a recovery, before the engine counts as healthy: a watch event and a probe."""
    truth_timeout_s: float = 60.0


@dataclass
class Slot:
    name: str
    host: str
    proc: Proc | None = None
    state: str = "healthy"


@dataclass
class Chaos:
    cluster: SimCluster
    procs: Processes
    model: str
    token_delay: float
    settings: ChaosSettings
    converged: Callable[[], Awaitable[bool]]
    """Whether the router's engines equal the truth right now."""
    rng: random.Random
    slots: list[Slot] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    outages: list[tuple[float, float | None]] = field(default_factory=list)
    """Each API outage: its length, and the time to truth after it (None: not within bound)."""
    spans: list[list[Any]] = field(default_factory=list)
    """Each fault as `[what, began, ended or None]`, e.g. `["hung engine-2", 41.0, 60.2]`."""
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _lit: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _last_outage_end: float = 0.0

    async def start_engines(self, names: list[str], hosts: list[str]) -> None:
        self._lit.set()
        for name, host in zip(names, hosts, strict=True):
            slot = Slot(name, host)
            self.slots.append(slot)
            await self._start(slot)
            self.cluster.apply_pod(name, host, model=self.model)
            self.timeline.up(name, time.monotonic())

    def engine_url(self, slot: Slot) -> str:
        return f"http://{slot.host}:{self.cluster.port}"

    async def _start(self, slot: Slot) -> None:
        argv = [sys.executable, "-m", "headcount.sim.engine", "--host", slot.host]
        argv += ["--port", str(self.cluster.port), "--model", self.model, "--name", slot.name]
        argv += ["--token-delay", str(self.token_delay)]
        slot.proc = self.procs.start(slot.name, argv)
        url = self.engine_url(slot) + "/sim/stats"

        async def answers() -> bool:
            if slot.proc is not None and not slot.proc.alive():
                raise BenchError(f"{slot.name} exited:\n{slot.proc.log_tail()}")
            timeout = aiohttp.ClientTimeout(total=1)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(url) as response:
                    return response.status == 200

        try:
            await wait_until(answers, timeout=30, interval=0.1, what=f"{slot.name} to answer")
        except TimeoutError as exc:
            raise BenchError(str(exc)) from None

    async def _reap(self, proc: Proc) -> None:
        """`Processes.stop` (SIGTERM, then SIGKILL), off the loop the emulator shares."""
        await asyncio.to_thread(self.procs.stop, proc)

    async def _fail_mode(self, slot: Slot, mode: str) -> None:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            url = self.engine_url(slot) + "/sim/fail-mode"
            async with session.post(url, json={"mode": mode}) as response:
                response.raise_for_status()

    # --- the schedule ---------------------------------------------------------------

    async def run(self, until: float) -> None:
        """Start faults until `until`; those still running go on to their natural end."""
        kinds = [kind for kind, _ in self.settings.weights]
        weights = [weight for _, weight in self.settings.weights]
        while time.monotonic() < until and not self._stop.is_set():
            await self._pause(self.rng.uniform(*self.settings.gap_s))
            if time.monotonic() >= until or self._stop.is_set():
                break
            kind = self.rng.choices(kinds, weights)[0]
            fault = self._fault(kind)
            if fault is None:
                self.counts[f"{kind} skipped"] += 1
                continue
            self.counts[kind] += 1
            task = asyncio.create_task(fault)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def heal(self, timeout: float = 90.0) -> None:
        """End every fault now: each heals what it broke. Raises if one does not."""
        self._stop.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=timeout)
            if pending:
                raise BenchError(f"{len(pending)} fault(s) did not heal within {timeout:g} s")

    def _fault(self, kind: str) -> Awaitable[None] | None:
        if kind == "blackhole":
            spaced = time.monotonic() - self._last_outage_end > self.settings.blackhole_spacing_s
            return self._blackhole() if self._lit.is_set() and spaced else None
        healthy = [slot for slot in self.slots if slot.state == "healthy"]
        if len(healthy) < 2:
            return None
        slot = self.rng.choice(healthy)
        faults = {"kill": self._kill, "restart": self._restart, "hang": self._hang}
        return faults.get(kind, self._flap)(slot)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    def _note(self, kind: str, what: str) -> None:
        self.events.append((time.monotonic(), kind, what))

    def in_progress(self, at: float) -> list[str]:
        """The faults in progress at `at` (an engine counts as broken until it is healthy)."""
        return [what for what, began, ended in self.spans if began <= at < (ended or math.inf)]

    def _open_span(self, what: str) -> None:
        self.spans.append([what, time.monotonic(), None])

    def _close_span(self, what: str) -> None:
        for span in reversed(self.spans):
            if span[0] == what and span[2] is None:
                span[2] = time.monotonic()
                return

    def _break(self, slot: Slot, state: str) -> None:
        slot.state = state
        self.timeline.down(slot.name, time.monotonic())
        self._open_span(f"{state} {slot.name}")

    async def _recovered(self, slot: Slot) -> None:
        """Healthy again once the router can know it: the API answers, then `settle`."""
        broken = f"{slot.state} {slot.name}"
        slot.state = "settling"
        await self._lit.wait()
        await self._pause(self.settings.settle_s)
        self._close_span(broken)
        slot.state = "healthy"
        self.timeline.up(slot.name, time.monotonic())
        self._note("healthy", slot.name)

    async def _back(self, slot: Slot, what: str) -> None:
        """A new engine process, its pod Ready (created again if it was deleted), healthy."""
        await self._start(slot)
        self.cluster.apply_pod(slot.name, slot.host, model=self.model)
        self._note(what, slot.name)
        await self._recovered(slot)

    # --- the faults -----------------------------------------------------------------

    async def _kill(self, slot: Slot) -> None:
        self._break(slot, "killed")
        self._note("kill", slot.name)
        if slot.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(slot.proc.pid, signal.SIGKILL)  # a crash, not a shutdown
            await self._reap(slot.proc)
        await self._pause(self.rng.uniform(0.2, 2.0))
        self.cluster.api.delete_pod(self.cluster.namespace, slot.name)
        self._note("pod deleted", slot.name)
        await self._pause(self.rng.uniform(*self.settings.down_s))
        await self._back(slot, "restarted, new pod")

    async def _restart(self, slot: Slot) -> None:
        self._break(slot, "restarting")
        self.cluster.apply_pod(slot.name, slot.host, model=self.model, ready=False)
        self._note("restart: pod NotReady", slot.name)
        await self._pause(0.5)
        if slot.proc is not None:
            await self._reap(slot.proc)
        await self._pause(self.rng.uniform(1.0, 3.0))
        await self._back(slot, "restart: up, pod Ready")

    async def _hang(self, slot: Slot) -> None:
        self._break(slot, "hung")
        await self._fail_mode(slot, "hang")
        self._note("hang", slot.name)
        await self._pause(self.rng.uniform(*self.settings.hang_s))
        if self.rng.random() < 0.5:
            await self._fail_mode(slot, "none")
            self._note("unhang", slot.name)
            await self._recovered(slot)
            return
        self.cluster.apply_pod(slot.name, slot.host, model=self.model, ready=False)
        if slot.proc is not None:
            await self._reap(slot.proc)
        await self._back(slot, "hung: container restarted")

    async def _flap(self, slot: Slot) -> None:
        self._break(slot, "flapping")
        flips = self.rng.randint(*self.settings.flaps)
        self._note("flap", f"{slot.name} x{flips}")
        for _ in range(flips):
            self.cluster.apply_pod(slot.name, slot.host, model=self.model, ready=False)
            await self._pause(self.rng.uniform(*self.settings.flap_s))
            self.cluster.apply_pod(slot.name, slot.host, model=self.model)
            await self._pause(self.rng.uniform(*self.settings.flap_s))
        await self._recovered(slot)

    async def _blackhole(self) -> None:
        self._lit.clear()
        started = time.monotonic()
        self._open_span("API blackholed")
        await self.cluster.api.blackhole()
        self._note("API blackholed", "")
        await self._pause(self.rng.uniform(*self.settings.blackhole_s))
        await self.cluster.api.restore()
        restored = time.monotonic()
        self._close_span("API blackholed")
        self._lit.set()
        self._last_outage_end = restored
        self._note("API restored", "")
        try:
            await wait_until(
                self.converged, timeout=self.settings.truth_timeout_s, interval=0.1, what="truth"
            )
            truth: float | None = time.monotonic() - restored
        except TimeoutError:
            truth = None
        self.outages.append((restored - started, truth))
        self._note("router matches the truth", "" if truth is None else f"after {truth:.2f} s")
