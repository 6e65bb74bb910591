"""A first-byte watchdog per engine: requests move off an engine that stopped answering.

An engine can stop answering completions while its probes pass (a wedged
engine loop behind a live HTTP server): every request sent there would wait
the whole `--read-timeout` (300 s) and no bound on in-flight requests fires.
Before the first byte nothing has been relayed, so such a request can move.

An engine is *stalled* when a request has waited `timeout` for its first byte
and, in that time, the engine has sent no response head to any request and
has processed no token: an engine that is merely slow but still answering
others is left alone, and so is one generating long unstreamed answers, which
vLLM heads only when they are done (an 80 s batch answer sends nothing for
80 s while the engine works). Tokens are seen in vLLM's token counters
(`EngineLoad.progress`, `prompt_tokens_total` plus `generation_tokens_total`)
as the prober scrapes them every probe interval, so they are evidence only
if a scrape came within the window (`EngineLoad.scrapes`): a window that no
scrape reached proves nothing and stalls nothing, which costs little:
scrapes come every probe interval, so with `--probe-interval` under
`timeout` (5 s against 30 s by default) every window has one, and an engine
whose probes stop landing is the prober's to take out of rotation, which
fails its waiting requests over too. An engine that exports no token counters (not vLLM, or its
`/metrics` failed) is judged on heads alone, as are its unstreamed answers:
one longer than `timeout` moves. vLLM counts a prompt's tokens when its
prefill ends, so one prefill longer than `timeout` on an otherwise idle
engine still looks stalled; `timeout` (30 s by default) is there to be above
it, and 0 turns the watchdog off.

The watch costs nothing per request: one timer per engine while requests wait
on it, ticking every `timeout / 2`. Each tick samples the request waiting
longest, the engine's count of response heads (`EngineLoad.answered`) and its
scraped progress; `stalled` compares two samples one `timeout` apart. A
stalled engine's waiting requests fail over at once (`Waiter.stalled`,
failover reason `engine_stalled`), and the engine is ejected as an outlier
for it (reason `stalled`, `fleet/outliers.py`), so new requests go elsewhere
too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from headcount.fleet import Engine, EngineLoad, Fleet
from headcount.fleet.outliers import STALLED
from headcount.surfaces.metrics import Metrics

__all__ = ["Sample", "StallWatch", "Waiter", "stalled"]


class Waiter(Protocol):
    """A request waiting for an engine's first byte (an `Exchange`)."""

    def stalled(self, message: str) -> None:
        """Its engine is stalled: stop waiting on it and fail over."""


@dataclass(frozen=True, slots=True)
class Sample:
    """What one tick saw of an engine."""

    oldest: object | None
    """The request waiting longest for a first byte; None: none waits."""
    answered: int
    """`EngineLoad.answered` then."""
    progress: float | None
    """`EngineLoad.progress` then: tokens processed by the last scrape, None: no counters."""
    scrapes: int
    """`EngineLoad.scrapes` then."""


def stalled(then: Sample, now: Sample) -> bool:
    """Whether an engine sampled `then` and `now`, one timeout apart, is stalled: the request
    waiting longest now was already waiting longest then, no response head came since and, if
    both samples know its token counters, a scrape since found them where they were."""
    if now.oldest is None or now.oldest is not then.oldest or now.answered != then.answered:
        return False
    if not _counted(then, now):
        return True
    return now.scrapes != then.scrapes and now.progress == then.progress


def _counted(then: Sample, now: Sample) -> bool:
    return then.progress is not None and now.progress is not None


class _Watch:
    __slots__ = ("engine", "load", "samples")

    def __init__(self, engine: Engine, first: Sample) -> None:
        self.engine = engine
        self.load: EngineLoad = engine.load
        self.samples: tuple[Sample | None, Sample] = (None, first)
        """The last two samples, the older first (the arming one counts as a tick's)."""


class StallWatch:
    """The watchdog over every engine's waiting requests (see the module docstring)."""

    def __init__(
        self,
        timeout: float,
        waiting: Mapping[str, Collection[Waiter]],
        fleet: Fleet,
        metrics: Metrics,
    ) -> None:
        """`waiting`: per engine id, the requests waiting for its first byte, oldest first
        (the proxy's own, kept by the exchanges); `fleet` ejects a stalled engine."""
        self._timeout = timeout
        self._waiting = waiting
        self._fleet = fleet
        self._metrics = metrics
        self._watches: dict[str, _Watch] = {}

    def watch(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        """Requests now wait on `engine`: tick until none does (no-op if ticking already)."""
        if engine.id in self._watches:
            return
        self._watches[engine.id] = _Watch(engine, self._sample(engine.id, engine.load))
        loop.call_later(self._timeout / 2, self._tick, engine.id, loop)

    def _sample(self, engine_id: str, load: EngineLoad) -> Sample:
        waiting = self._waiting.get(engine_id)
        oldest = next(iter(waiting), None) if waiting else None
        return Sample(oldest, load.answered, load.progress, load.scrapes)

    def _tick(self, engine_id: str, loop: asyncio.AbstractEventLoop) -> None:
        watch = self._watches[engine_id]
        current = self._fleet.snapshot.by_id.get(engine_id)
        renewed = current is not None and current.load is not watch.load
        if current is not None and renewed:  # removed and added again: its count starts over
            watch.engine, watch.load = current, current.load
        now = self._sample(engine_id, watch.load)
        then = None if renewed else watch.samples[0]
        if then is not None and stalled(then, now):
            self._stall(watch.engine, counted=_counted(then, now))
            now = self._sample(engine_id, watch.load)
        if now.oldest is None:
            del self._watches[engine_id]
            return
        watch.samples = (None if renewed else watch.samples[1], now)
        loop.call_later(self._timeout / 2, self._tick, engine_id, loop)

    def _stall(self, engine: Engine, *, counted: bool) -> None:
        """Move every request waiting on `engine`, then eject it (once moved, so that they
        fail over as `engine_stalled`, not as having seen it leave rotation). `counted`: its
        token counters stood still too."""
        tokens = " and no token processed" if counted else ""
        message = (
            f"engine {engine.spec.name} stalled: no response byte to any request{tokens} "
            f"in {self._timeout:g}s"
        )
        for waiter in list(self._waiting.get(engine.id, ())):
            waiter.stalled(message)
        if self._fleet.record_error(engine.id, STALLED, decisive=True):
            self._metrics.outlier_ejected(STALLED)
