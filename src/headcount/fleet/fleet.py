"""The engine set the router believes in: one owner, immutable snapshots for readers.

Discovery tells the fleet which engines exist (`reconcile`, `upsert`, `remove`),
the prober tells it how they are (`apply_probe`), the proxy reports connect
failures (`eject`) and errors (`record_error`, which ejects outliers for a
while: `outliers.py`). Readers (routing, `/v1/models`, `/engines`, health,
metrics) take `fleet.snapshot`, an immutable view whose indexes are built once;
writers mark it stale and the next reader rebuilds it, so a burst of watch
events costs one rebuild, and so does the end of an outlier ejection (the
snapshot knows when the first one ends). Removing an engine drops every piece
of per-engine state with it.

Every state change is logged once, with its reason (`story.py`): the
reason for a removal comes from the source that knows it.

Listeners hear every write that changes the engine set or takes an engine out
of rotation (`FleetChange.left`), so the proxy can fail over requests still
waiting on it at once.

The values it holds (`Engine`, `EngineSpec`, `EngineLoad`, `EngineState`,
`ProbeResult`) live below it in `engine.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from headcount.clock import Clock
from headcount.fleet import story
from headcount.fleet.capacity import learn_capacity
from headcount.fleet.engine import Engine, EngineLoad, EngineSpec, EngineState, ProbeResult
from headcount.fleet.outliers import next_ejection, route_around

if TYPE_CHECKING:
    from headcount.config import OutlierSettings

__all__ = ["Fleet", "FleetChange", "FleetListener", "Snapshot"]


class Snapshot:
    """An immutable view of the fleet, with its indexes built once.

    `ejected` are the engines outlier-ejected when it was built; a model with more than
    `max_ejected_percent` of its routable engines ejected is `panicking` and routed to
    all of them (100: never).
    """

    __slots__ = (
        "_by_model",
        "_known_models",
        "by_id",
        "ejected",
        "engines",
        "panicking",
        "version",
    )

    def __init__(
        self,
        engines: Iterable[Engine],
        version: int,
        *,
        ejected: frozenset[str] = frozenset(),
        max_ejected_percent: float = 100.0,
    ) -> None:
        self.engines: tuple[Engine, ...] = tuple(sorted(engines, key=lambda e: e.spec.name))
        self.version = version
        self.ejected = ejected
        self.by_id: Mapping[str, Engine] = {engine.id: engine for engine in self.engines}
        by_model: dict[str, list[Engine]] = {}
        known: set[str] = set()
        for engine in self.engines:
            served = engine.served
            known.update(served)
            if engine.spec.model_label:
                known.add(engine.spec.model_label)
            if engine.routable:
                for model in served:
                    by_model.setdefault(model, []).append(engine)
        self._by_model: Mapping[str, tuple[Engine, ...]]
        self._by_model, self.panicking = route_around(
            by_model, lambda engine: engine.id in ejected, max_ejected_percent
        )
        self._known_models = frozenset(known)

    def candidates(self, model: str) -> tuple[Engine, ...]:
        """Routable engines that serve `model` (a base model or an adapter), outliers left out
        unless the model is panicking."""
        return self._by_model.get(model, ())

    def is_known(self, model: str) -> bool:
        """Whether any engine, routable or not, serves or is labelled with `model`."""
        return model in self._known_models

    @property
    def routable(self) -> tuple[Engine, ...]:
        return tuple(engine for engine in self.engines if engine.routable)

    def model_cards(self) -> list[Mapping[str, Any]]:
        """The union of `/v1/models` entries over routable engines, one per model id."""
        cards: dict[str, Mapping[str, Any]] = {}
        for engine in self.engines:
            if engine.routable:
                for card in engine.cards:
                    cards.setdefault(str(card["id"]), card)
        return [cards[model] for model in sorted(cards)]

    def count_by_state(self) -> dict[EngineState, int]:
        counts = dict.fromkeys(EngineState, 0)
        for engine in self.engines:
            counts[engine.state] += 1
        return counts


@dataclass(frozen=True, slots=True)
class FleetChange:
    """What one write did; the prober probes `to_probe` at once."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    unchanged: int = 0
    left: tuple[str, ...] = ()
    """Engines still known that left rotation: unhealthy, ejected, not ready, asleep, moved."""

    @property
    def to_probe(self) -> tuple[str, ...]:
        return self.added + self.changed


FleetListener = Callable[[FleetChange], None]


class Fleet:
    """Owns engine state; every write goes through here, every read through `snapshot`."""

    def __init__(
        self,
        *,
        unhealthy_after: int,
        outliers: OutlierSettings | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        """`unhealthy_after`: consecutive failed probes before a READY engine leaves rotation;
        `outliers`: when `record_error` ejects an engine and for how long (None: never);
        `clock` times ejections."""
        self._engines: dict[str, Engine] = {}
        self._unhealthy_after = unhealthy_after
        self._outliers = outliers
        self._now = clock
        self._listeners: list[FleetListener] = []
        self._version = 0
        self._snapshot = Snapshot((), 0)
        self._stale = False
        self._ejection_ends: float | None = None
        """When the first active ejection ends: the snapshot is rebuilt then."""
        self._left: list[str] = []
        self.unroutable_reason = ""
        """Why no engine is routable, as health last judged it (`surfaces/health_watch.py`
        sets it; `""` while one is): what the proxy's 503 for an empty fleet says."""
        """Engines that left rotation since the last publication."""

    @property
    def snapshot(self) -> Snapshot:
        ends = self._ejection_ends
        if self._stale or (ends is not None and self._now() >= ends):
            self._rebuild()
        return self._snapshot

    def now(self) -> float:
        """The fleet's clock, which times ejections."""
        return self._now()

    def subscribe(self, listener: FleetListener) -> None:
        self._listeners.append(listener)

    def reconcile(
        self,
        source: str,
        specs: Iterable[EngineSpec],
        *,
        removed_reason: str = "no longer listed",
        removal_is_failure: bool = False,
    ) -> FleetChange:
        """Make `source`'s engines exactly `specs`: add new, re-probe changed, remove gone
        (logged with `removed_reason`, as a WARNING if `removal_is_failure`)."""
        wanted = {spec.id: spec for spec in specs}
        removed = tuple(
            engine_id
            for engine_id, engine in self._engines.items()
            if engine.spec.source == source and engine_id not in wanted
        )
        for engine_id in removed:
            gone = self._engines.pop(engine_id)
            story.removed(gone, removed_reason, failure=removal_is_failure)
        added: list[str] = []
        changed: list[str] = []
        unchanged = 0
        for spec in wanted.values():
            outcome = self._put(spec)
            if outcome == "added":
                added.append(spec.id)
            elif outcome == "changed":
                changed.append(spec.id)
            else:
                unchanged += 1
        return self._publish(FleetChange(tuple(added), tuple(changed), removed, unchanged))

    def upsert(self, spec: EngineSpec) -> FleetChange:
        """Add or update one engine (a watch ADDED/MODIFIED event)."""
        outcome = self._put(spec)
        if outcome == "added":
            return self._publish(FleetChange(added=(spec.id,)))
        if outcome == "changed":
            return self._publish(FleetChange(changed=(spec.id,)))
        return FleetChange(unchanged=1)

    def remove(
        self, engine_id: str, reason: str = "removed by its source", *, failure: bool = False
    ) -> FleetChange:
        """Forget one engine and all its state (a watch DELETED event, or an object that is no
        engine any more); `reason` says why in the log, as a WARNING if `failure`."""
        gone = self._engines.pop(engine_id, None)
        if gone is None:
            return FleetChange()
        story.removed(gone, reason, failure=failure)
        return self._publish(FleetChange(removed=(engine_id,)))

    def source_ids(self, source: str) -> frozenset[str]:
        return frozenset(e.id for e in self._engines.values() if e.spec.source == source)

    def apply_probe(self, engine_id: str, result: ProbeResult) -> None:
        """Record a probe; ignored if the engine was removed while it was being probed.

        A success after a failed probe also ends an outlier ejection: the engine went down
        and came back. An inconclusive failure only records its error.
        """
        engine = self._engines.get(engine_id)
        if engine is None:
            return
        if result.ok:
            load, scraped = engine.load, result.load
            load.running, load.waiting, load.kv_usage = (
                scraped.running,
                scraped.waiting,
                scraped.kv_usage,
            )
            load.prefix_cache_queries = scraped.prefix_cache_queries
            load.prefix_cache_hits = scraped.prefix_cache_hits
            load.kv_capacity_blocks = scraped.kv_capacity_blocks
            load.kv_block_size = scraped.kv_block_size
            load.progress = scraped.progress
            load.concurrency = learn_capacity(load.concurrency, scraped.running, scraped.waiting)
            load.scrapes += 1
            ejection = engine.ejection
            if engine.probe_failures and ejection.active(now := self._now()):
                ejection = replace(ejection, until=now)
            updated = replace(
                engine,
                state=_healthy_state(engine.spec),
                cards=result.cards,
                probe_failures=0,
                last_error=None,
                ejection=ejection,
            )
            reason = story.state_reason(engine.spec)
        elif result.inconclusive:
            updated, reason = replace(engine, last_error=result.error), ""
        else:
            failures = engine.probe_failures + 1
            state = engine.state
            if engine.state is EngineState.PENDING or failures >= self._unhealthy_after:
                state = EngineState.UNHEALTHY
            updated = replace(engine, state=state, probe_failures=failures, last_error=result.error)
            reason = f"probe failed: {result.error}"
        if updated != engine:
            self._store(updated, reason=reason)
            self._publish_left()

    def eject(self, engine_id: str, reason: str) -> None:
        """Take an engine out of rotation until its next successful probe (passive health)."""
        engine = self._engines.get(engine_id)
        if engine is not None and engine.state is EngineState.READY:
            self._store(
                replace(engine, state=EngineState.UNHEALTHY, last_error=reason), reason=reason
            )
            self._publish_left()

    def record_error(self, engine_id: str, reason: str, *, decisive: bool = False) -> bool:
        """Count an error (`outliers.REASONS`) against an engine, `decisive`: as reaching the
        count at once; True when it was ejected for it now. The proxy resets the count on an
        answer under 500."""
        engine = self._engines.get(engine_id)
        settings = self._outliers
        if engine is None or settings is None or not settings.consecutive_errors:
            return False
        load = engine.load
        load.consecutive_errors += 1
        count_short = load.consecutive_errors < settings.consecutive_errors
        if count_short and not decisive:
            return False
        load.consecutive_errors = 0
        now = self._now()
        if engine.ejection.active(now):
            return False  # answers to requests sent before the ejection
        ejection = next_ejection(engine.ejection, now, reason, settings)
        count = None if decisive and count_short else settings.consecutive_errors
        story.ejected(engine, ejection, now, count)
        self._store(replace(engine, ejection=ejection), ejected=True)
        self._publish_left()
        return True

    def _put(self, spec: EngineSpec) -> str:
        current = self._engines.get(spec.id)
        if current is None:
            state = EngineState.PENDING if spec.ready else EngineState.NOT_READY
            self._store(Engine(spec=spec, load=EngineLoad(), state=state))
            return "added"
        if current.spec == spec:
            return "unchanged"
        if current.spec.probe_key() == spec.probe_key():
            self._store(replace(current, spec=spec))
            return "unchanged"
        self._store(
            replace(current, spec=spec, state=_state_after_change(current, spec)),
            reason=story.spec_change_reason(current.spec, spec),
        )
        return "changed"

    def _store(self, engine: Engine, *, ejected: bool = False, reason: str = "") -> None:
        """Write `engine` and log its arrival, or its change of state for `reason`."""
        previous = self._engines.get(engine.id)
        self._engines[engine.id] = engine
        if previous is None:
            story.added(engine)
        else:
            story.changed(previous, engine, reason)
        self._version += 1
        self._stale = True
        if previous is not None and previous.routable and (ejected or not engine.routable):
            self._left.append(engine.id)

    def _publish(self, change: FleetChange) -> FleetChange:
        if change.removed:
            self._version += 1
            self._stale = True
        if self._left:
            change = replace(change, left=tuple(dict.fromkeys(self._left)))
            self._left.clear()
        for listener in self._listeners:
            listener(change)
        return change

    def _publish_left(self) -> None:
        if self._left:
            self._publish(FleetChange())

    def _rebuild(self) -> None:
        """A new snapshot: the outliers ejected now left out, panics and returns logged."""
        now = self._now()
        out = [engine for engine in self._engines.values() if engine.ejection.active(now)]
        ejected = frozenset(engine.id for engine in out)
        percent = self._outliers.max_ejected_percent if self._outliers is not None else 100.0
        previous = self._snapshot
        snapshot = Snapshot(
            self._engines.values(), self._version, ejected=ejected, max_ejected_percent=percent
        )
        self._snapshot, self._stale = snapshot, False
        self._ejection_ends = min((engine.ejection.until for engine in out), default=None)
        for engine_id in previous.ejected - ejected:
            if engine_id in snapshot.by_id:
                story.ejection_over(snapshot.by_id[engine_id])
        for model in snapshot.panicking - previous.panicking:
            story.panic_started(model, percent)
        for model in previous.panicking - snapshot.panicking:
            story.panic_over(model)


def _state_after_change(current: Engine, spec: EngineSpec) -> EngineState:
    """A changed engine keeps serving on what it last proved, unless its address moved."""
    if not spec.ready:
        return EngineState.NOT_READY
    if spec.url != current.spec.url:
        return EngineState.PENDING
    if current.state in (EngineState.READY, EngineState.SLEEPING):
        return _healthy_state(spec)
    return current.state if current.state is not EngineState.NOT_READY else EngineState.PENDING


def _healthy_state(spec: EngineSpec) -> EngineState:
    if not spec.ready:
        return EngineState.NOT_READY
    if spec.sleeping:
        return EngineState.SLEEPING
    return EngineState.READY
