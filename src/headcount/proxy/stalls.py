"""A first-byte watchdog per engine: requests move off an engine that stopped answering.

An engine can stop answering completions while its probes pass (a wedged
engine loop behind a live HTTP server): every request sent there would wait
the whole `--read-timeout` (300 s) and no bound on in-flight requests fires.
Before the first byte nothing has been relayed, so such a request can move.

An engine is *stalled* when a request has waited `timeout` for its first byte
and, in that time, the engine has sent no response head to any request: an
engine that is merely slow but still answering others is left alone. One long
prefill on an otherwise idle engine looks the same; `timeout` (30 s by
default) is there to be above it, and 0 turns the watchdog off.

The watch costs nothing per request: one timer per engine while requests wait
on it, ticking every `timeout / 2`. Each tick samples the request waiting
longest and the engine's count of response heads (`EngineLoad.answered`);
`stalled` compares two samples one `timeout` apart. A stalled engine's waiting
requests fail over at once (`Waiter.stalled`, failover reason
`engine_stalled`), and the engine is ejected as an outlier for it (reason
`stalled`, `fleet/outliers.py`), so new requests go elsewhere too.
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


def stalled(then: Sample, now: Sample) -> bool:
    """Whether an engine sampled `then` and `now`, one timeout apart, is stalled: the request
    waiting longest now was already waiting longest then, and no response head came since."""
    return now.oldest is not None and now.oldest is then.oldest and now.answered == then.answered


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
        return Sample(next(iter(waiting), None) if waiting else None, load.answered)

    def _tick(self, engine_id: str, loop: asyncio.AbstractEventLoop) -> None:
        watch = self._watches[engine_id]
        current = self._fleet.snapshot.by_id.get(engine_id)
        renewed = current is not None and current.load is not watch.load
        if current is not None and renewed:  # removed and added again: its count starts over
            watch.engine, watch.load = current, current.load
        now = self._sample(engine_id, watch.load)
        then = None if renewed else watch.samples[0]
        if then is not None and stalled(then, now):
            self._stall(watch.engine)
            now = self._sample(engine_id, watch.load)
        if now.oldest is None:
            del self._watches[engine_id]
            return
        watch.samples = (None if renewed else watch.samples[1], now)
        loop.call_later(self._timeout / 2, self._tick, engine_id, loop)

    def _stall(self, engine: Engine) -> None:
        """Move every request waiting on `engine`, then eject it (once moved, so that they
        fail over as `engine_stalled`, not as having seen it leave rotation)."""
        message = (
            f"engine {engine.spec.name} stalled: no response byte to any request "
            f"in {self._timeout:g}s"
        )
        for waiter in list(self._waiting.get(engine.id, ())):
            waiter.stalled(message)
        if self._fleet.record_error(engine.id, STALLED, decisive=True):
            self._metrics.outlier_ejected(STALLED)
