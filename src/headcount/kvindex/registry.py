"""Every engine's cache index, following the fleet: what kv-aware routing asks and health shows.

`KvIndexes` keeps, for each engine discovery knows (ready or not: a
not-ready engine still fills its cache), a subscriber to its KV events on
its host (ports from its annotations, else the router's defaults), the
`EngineIndex` the events build and the `TrustFacts` they and the router's
own traffic record. An engine that appears gets a subscriber at once; one
whose address or ports change gets a new subscriber and an empty index; one
that leaves takes every piece of its state with it. Engines sharing a
KV-event endpoint get no subscriber (`endpoints.py`). Each index gets its
share of the memory bounds (`memory.py`); one over a share that shrank (more
engines) loses its hints, then what it holds, and rebuilds. A tick every second
re-reads the fleet (so an annotation change is seen even when nothing else
changed), applies each engine's advertised capacity, drops the hints a gap
the replay could not fill left (`EngineIndex.keep_as_hints`) once the rebuild
window is over, and checks the engine's own prefix-cache hit counter against
what the index predicted:

- Over a window of at least `check_window` seconds and `min_requests`
  requests the engine answered (so it counted their hits), its hits must
  reach half of the tokens the index predicted cached for them, less two
  blocks. Other routers' traffic only adds hits, so only over-prediction
  counts; half absorbs the scrape lag (a probe interval) and blocks evicted
  between routing and admission.
  Below that the index is wrong: it is cleared (`disagreement`) and stale
  until a window agrees, then rebuilding for `rebuild_window`. An engine
  whose counter went backwards restarted: the window starts again, and
  unless its event stream already showed the restart (it does not when the
  router was disconnected while the new process's sequence passed the old
  one), the index is cleared, rebuilding.

Routing reads `match` (None for an unusable index), `block_size`, and tells
`routed` (at dispatch) and `prefilled` (at a 2xx first byte); all are O(1) but
`match`, O(the request's blocks). Routing's traffic does not enter into trust:
the stream's own liveness check does (`subscriber.py`). A publisher not
reached for `idle_timeout` is logged once per absence (a lost one is logged
when it is lost, as every change of trust is).

Over 450 lines: an engine's sink (`_Tracked`) and the registry's tick write
the same trust facts (the stream's, the scrape's, the memory share's), and
split apart each would reach into the other's state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from headcount.clock import Clock
from headcount.config import KvEventsSettings
from headcount.fleet import Fleet, FleetChange
from headcount.kvevents import AllBlocksCleared, EventBatch
from headcount.kvindex.endpoints import Endpoints, shared_endpoints
from headcount.kvindex.index import BLOCK_BYTES, DEFAULT_CAPACITY, EngineIndex
from headcount.kvindex.keys import BlockKey
from headcount.kvindex.memory import IndexMemory
from headcount.kvindex.stream import ClearReason, StreamSink, SubscriberFactory, SubscriberTarget
from headcount.kvindex.trust import IndexTrust, TrustFacts, evaluate
from headcount.kvindex.view import IndexView
from headcount.log_limit import LogLimit

__all__ = ["KvIndexes"]

_log = logging.getLogger(__name__)

_INCOMPLETE = {
    ClearReason.GAP: "the replay could not fill a gap",
    ClearReason.OVERFLOW: "more blocks than the engine holds: removals were missed",
    ClearReason.DISAGREEMENT: "the engine's hits contradicted the index",
}
"""Clears that leave the engine's cache full while the index is empty."""
_IN_SEQUENCE = "batches in sequence"
_RESTART_DELAY = 1.0
"""Before a crashed subscriber is started again."""
_LOG_EVERY = 60.0
"""Seconds between two lines of one kind about one engine."""


@dataclass(slots=True)
class _Window:
    """The current hit-agreement check window of one engine."""

    started: float
    hits_at_start: float | None
    predicted: int = 0
    requests: int = 0


class _Tracked(StreamSink):
    """One engine: its subscriber task, index, trust facts and counters; the stream's sink."""

    def __init__(
        self, name: str, target: SubscriberTarget, owner: KvIndexes, shared: str | None
    ) -> None:
        self.name = name
        self.target = target
        self._owner = owner
        self.index = EngineIndex()
        self.facts = TrustFacts(endpoint=target.endpoint, shared=shared)
        self.trust, self.reason = self._evaluate()
        self.task: asyncio.Task[None] | None = None
        self.last_event_at: float | None = None
        self.events_applied = self.gaps = self.replays_filled = self.replays_failed = 0
        self.clears = dict.fromkeys(ClearReason, 0)
        self.predicted_hit_tokens = 0
        self.reported_hit_tokens: float | None = None
        self.scraped_block_size: int | None = None
        self.restart_seen_at: float | None = None
        self._unfilled: str | None = None
        """The missed batches of the last gap the replay could not fill."""
        self.window = _Window(owner.now(), None)
        self.down_since: float | None = owner.now()
        """When the session was lost (or the subscriber started); None: connected, or the
        absence was logged."""
        self.logs = LogLimit(_log, _LOG_EVERY, owner.now)

    def connected(self, up: bool) -> None:
        facts = self.facts
        facts.connected = up
        facts.ever_connected |= up
        if up:
            facts.confirmed_at, facts.unconfirmed_why = None, None
            self.down_since = None
        elif self.down_since is None:
            self.down_since = self._owner.now()
        self.refresh()

    def confirmed(self, latest: int | None) -> None:
        facts = self.facts
        facts.confirmed_at, facts.unconfirmed_why = self._owner.now(), None
        facts.confirmed_how = (
            "the publisher has sent no batch: an empty cache"
            if latest is None
            else f"the publisher's latest batch, {latest}, is applied"
        )
        self.refresh()

    def unconfirmed(self, why: str) -> None:
        self.facts.unconfirmed_why = why
        self.refresh()

    def unreached(self, now: float, after: float) -> None:
        """Log once a publisher that is not reached for `after` seconds."""
        since = self.down_since
        if since is None or now - since < after or self.facts.shared is not None:
            return
        self.down_since = None
        self.logs.log(
            "unreached",
            logging.WARNING,
            "kv index of %s: %s for %.0fs (is vLLM's --kv-events-config publishing there?); "
            "routed by load",
            self.name,
            self.reason,
            now - since,
        )

    def batch(self, seq: int, batch: EventBatch) -> None:
        now = self._owner.now()
        refused = self.index.refused
        for event in batch.events:
            if not self.index.apply(event):
                self.facts.unknown_parent_at = now
            elif isinstance(event, AllBlocksCleared):
                self._cleared(ClearReason.ALL_BLOCKS_CLEARED, now)
        self.events_applied += len(batch.events)
        self.last_event_at = now
        facts = self.facts
        facts.confirmed_at, facts.confirmed_how, facts.unconfirmed_why = now, _IN_SEQUENCE, None
        if self.index.refused > refused:
            limit = self.index.limit
            self.facts.refused_at = now
            self.facts.refused_why = (
                f"over its memory bound of {limit * BLOCK_BYTES / 2**20:.1f} MiB "
                f"({limit} blocks): new blocks not indexed"
            )
        if self.index.overflowing:
            self.clear(ClearReason.OVERFLOW)
        self.refresh()

    def gap(self, expected: int, got: int) -> None:
        self.gaps += 1
        self.facts.gap = (expected, got)
        self.refresh()

    def replayed(self, filled: bool) -> None:
        gap, self.facts.gap = self.facts.gap, None
        if filled:
            self.replays_filled += 1
        else:
            self.replays_failed += 1
            self._unfilled = None if gap is None else f"{gap[0]}..{gap[1] - 1}"
            self._rebuilding(ClearReason.GAP, self._owner.now())
        self.refresh()

    def clear(self, reason: ClearReason) -> None:
        if reason is ClearReason.GAP:
            self.index.keep_as_hints()
        else:
            self.index.clear()
        self._cleared(reason, self._owner.now())
        self.refresh()

    def _cleared(self, reason: ClearReason, now: float) -> None:
        self.clears[reason] += 1
        if reason is ClearReason.RESTART:
            self.restart_seen_at = now
        facts = self.facts
        if reason in _INCOMPLETE:
            self._rebuilding(reason, now)
        else:
            facts.rebuilding_since = facts.unknown_parent_at = None

    def _rebuilding(self, reason: ClearReason, now: float) -> None:
        why = _INCOMPLETE[reason]
        if reason is ClearReason.GAP and self._unfilled is not None:
            why = f"the replay could not fill the gap {self._unfilled}"
        self.facts.rebuilding_since, self.facts.rebuilding_why = now, f"cleared, {why}"

    @property
    def block_size(self) -> int | None:
        """From the events, else as scraped from `vllm:cache_config_info`."""
        return self.index.block_size or self.scraped_block_size

    def share(self, limit: int) -> None:
        """Bound the index to `limit` blocks; over it, its hints go, then what it holds."""
        index = self.index
        index.limit = limit
        if index.kept <= limit:
            return
        index.drop_hints()
        if index.kept > limit:
            index.clear()
            self.facts.rebuilding_since = self._owner.now()
            self.facts.rebuilding_why = (
                f"cleared, over its share of memory ({limit} blocks) after engines were added"
            )
        self.refresh()

    def restarted_unseen(self, now: float) -> None:
        """The engine restarted without its stream showing it (its hit counter went back):
        emptied, and rebuilding, since events may have come from the new process already."""
        self.index.clear()
        self._cleared(ClearReason.RESTART, now)
        self.facts.rebuilding_since = now
        self.facts.rebuilding_why = "cleared, the engine restarted while the stream did not show it"

    def _evaluate(self) -> tuple[IndexTrust, str]:
        owner = self._owner
        return evaluate(
            self.facts,
            owner.now(),
            idle_timeout=owner.idle_timeout,
            rebuild_window=owner.rebuild_window,
        )

    def refresh(self) -> None:
        trust, reason = self._evaluate()
        if trust is not self.trust:
            level = logging.WARNING if not trust.usable else logging.INFO
            _log.log(level, "kv index of %s: %s -> %s (%s)", self.name, self.trust, trust, reason)
        self.trust, self.reason = trust, reason
        if self.index.deferred:
            self._owner.memory.wanted()

    def view(self, now: float) -> IndexView:
        last = self.last_event_at
        return IndexView(
            trust=self.trust,
            reason=self.reason,
            blocks=len(self.index),
            hints=self.index.hints,
            memory_bytes=self.index.charged * BLOCK_BYTES,
            memory_limit_bytes=self.index.limit * BLOCK_BYTES,
            refused_blocks=self.index.refused,
            capacity=None if self.index.capacity == DEFAULT_CAPACITY else self.index.capacity,
            block_size=self.block_size,
            last_event_age=None if last is None else now - last,
            events_applied=self.events_applied,
            gaps=self.gaps,
            replays_filled=self.replays_filled,
            replays_failed=self.replays_failed,
            clears=dict(self.clears),
            predicted_hit_tokens=self.predicted_hit_tokens,
            reported_hit_tokens=self.reported_hit_tokens,
            unknown_parents=self.index.unknown_parents,
        )


class KvIndexes:
    """The engines' cache indexes; `start` follows the fleet, `close` stops every subscriber."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        subscriber: SubscriberFactory,
        port: int,
        replay_port: int,
        topic: str,
        idle_timeout: float,
        replay_timeout: float,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rebuild_window: float = 30.0,
        check_window: float = 30.0,
        min_requests: int = 8,
        tick: float = 1.0,
        max_bytes: int = KvEventsSettings.index_max_bytes,
        max_bytes_per_engine: int = KvEventsSettings.index_max_bytes_per_engine,
    ) -> None:
        self._fleet = fleet
        self._subscriber = subscriber
        self._endpoints = Endpoints(port, replay_port, topic, replay_timeout)
        self.idle_timeout = idle_timeout
        self.rebuild_window = rebuild_window
        self._check_window = check_window
        self._min_requests = min_requests
        self.now = clock
        self._sleep = sleep
        self._tick = tick
        self.memory = IndexMemory(max_bytes, max_bytes_per_engine)
        self._engines: dict[str, _Tracked] = {}
        self._shared: frozenset[tuple[str, tuple[str, ...]]] = frozenset()
        """The endpoints more than one engine resolves to, with those engines' names."""
        self._ticker: asyncio.Task[None] | None = None
        self._tidier: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        """Subscribe to every known engine and follow the fleet from now on."""
        self._fleet.subscribe(self._on_change)
        self._reconcile()
        loop = asyncio.get_running_loop()
        self._ticker = loop.create_task(self._tick_forever())
        self._tidier = loop.create_task(
            self.memory.run(lambda: (t.index for t in self._engines.values())),
            name="kv index tidying",
        )

    async def close(self) -> None:
        self._closed = True  # the fleet keeps its listeners: later changes start nothing
        tasks = [t.task for t in self._engines.values() if t.task is not None]
        tasks += [t for t in (self._ticker, self._tidier) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._engines.clear()

    # --- what routing asks and tells

    def match(self, engine_id: str, keys: Sequence[BlockKey]) -> int | None:
        tracked = self._engines.get(engine_id)
        if tracked is None or not tracked.trust.usable:
            return None
        return tracked.index.match(keys)

    def block_size(self, engine_id: str) -> int | None:
        tracked = self._engines.get(engine_id)
        return None if tracked is None else tracked.block_size

    def usable(self, engine_id: str) -> bool:
        """Whether `match` answers for the engine (its index is usable)."""
        tracked = self._engines.get(engine_id)
        return tracked is not None and tracked.trust.usable

    def routed(self, engine_id: str, prompt_tokens: int, predicted_cached_tokens: int) -> None:
        tracked = self._engines.get(engine_id)
        if tracked is not None:
            tracked.predicted_hit_tokens += predicted_cached_tokens

    def prefilled(self, engine_id: str, predicted_cached_tokens: int) -> None:
        """Only requests the engine admitted (it answered) are held against its hit counter."""
        tracked = self._engines.get(engine_id)
        if tracked is not None:
            tracked.window.predicted += predicted_cached_tokens
            tracked.window.requests += 1

    # --- what the surfaces read

    def view(self, engine_id: str) -> IndexView | None:
        tracked = self._engines.get(engine_id)
        return None if tracked is None else tracked.view(self.now())

    def views(self) -> Mapping[str, IndexView]:
        now = self.now()
        return {engine_id: tracked.view(now) for engine_id, tracked in self._engines.items()}

    # --- following the fleet

    def _on_change(self, change: FleetChange) -> None:
        if not self._closed and (change.added or change.changed or change.removed):
            self._reconcile()

    def _reconcile(self) -> None:
        engines = self._fleet.snapshot.by_id
        for engine_id in [e for e in self._engines if e not in engines]:
            self._forget(engine_id)
        targets = {engine_id: self._endpoints.target(e.spec) for engine_id, e in engines.items()}
        shared = shared_endpoints({i: e.spec.name for i, e in engines.items()}, targets)
        self._warn_shared(shared.groups)
        for engine_id, engine in engines.items():
            target, why = targets[engine_id], shared.why.get(engine_id)
            tracked = self._engines.get(engine_id)
            if tracked is not None and (tracked.target, tracked.facts.shared) == (target, why):
                tracked.name = engine.spec.name
                continue
            if tracked is not None:
                self._forget(engine_id)
            if target is not None:
                self._follow(engine_id, engine.spec.name, target, why)
        self._share_memory()

    def _warn_shared(self, groups: frozenset[tuple[str, tuple[str, ...]]]) -> None:
        for endpoint, sharing in sorted(groups - self._shared):
            _log.warning(
                "engines %s share the KV-event endpoint %s: its events are attributed to none "
                "of them (they do not say which engine sent them); give each its own port "
                "(pod or Service annotations kv-events-port, kv-events-replay-port)",
                ", ".join(sharing),
                endpoint,
            )
        self._shared = groups

    def _share_memory(self) -> None:
        """Each followed index's share of the memory bounds, in blocks."""
        followed = [t for t in self._engines.values() if t.facts.shared is None]
        share = self.memory.share(len(followed))
        for tracked in followed:
            tracked.share(share)

    def _follow(
        self, engine_id: str, name: str, target: SubscriberTarget, shared: str | None
    ) -> None:
        tracked = _Tracked(name, target, self, shared)
        self._engines[engine_id] = tracked
        if shared is not None:
            tracked.index.limit = 0
        else:
            tracked.task = asyncio.get_running_loop().create_task(
                self._subscribe(tracked), name=f"kv events {name}"
            )

    def _forget(self, engine_id: str) -> None:
        tracked = self._engines.pop(engine_id)
        if tracked.task is not None:
            tracked.task.cancel()
        self.memory.forget(tracked.index)

    async def _subscribe(self, tracked: _Tracked) -> None:
        while True:
            try:
                await self._subscriber(tracked.target, tracked).run()
            except Exception:
                _log.exception("kv events of %s: the subscriber failed; restarting", tracked.name)
            tracked.connected(False)
            tracked.clear(ClearReason.GAP)  # what it missed meanwhile: hints until shown again
            await self._sleep(_RESTART_DELAY)

    # --- the tick: capacity, the engine's own hit counter, what the clock changes

    async def _tick_forever(self) -> None:
        while True:
            await self._sleep(self._tick)
            try:
                self.tick()
            except Exception:
                _log.exception("kv indexes: a tick failed")

    def tick(self) -> None:
        """One round: re-read the fleet, apply capacities, check windows, re-evaluate trust."""
        self._reconcile()
        engines = self._fleet.snapshot.by_id
        now = self.now()
        for engine_id, tracked in self._engines.items():
            engine = engines.get(engine_id)
            if engine is not None:
                load = engine.load
                tracked.index.capacity = load.kv_capacity_blocks or DEFAULT_CAPACITY
                tracked.scraped_block_size = load.kv_block_size
                tracked.reported_hit_tokens = load.prefix_cache_hits
                if tracked.index.overflowing:
                    tracked.clear(ClearReason.OVERFLOW)
                self._check_hits(tracked, load.prefix_cache_hits, now)
            since = tracked.facts.rebuilding_since
            if tracked.index.keeps_hints and (since is None or now - since >= self.rebuild_window):
                tracked.index.drop_hints()
            tracked.refresh()
            tracked.unreached(now, self.idle_timeout)

    @staticmethod
    def _counter_went_back(tracked: _Tracked, window: _Window, now: float) -> None:
        """The engine's hit counter went back: a new process, with an empty cache. Its event
        stream says so too (the sequence restarts) unless the router was disconnected while
        the new process passed the old sequence number; then only this tells."""
        seen = tracked.restart_seen_at
        if seen is not None and seen >= window.started:
            return
        _log.warning(
            "kv index of %s: the engine's hit counter went back: it restarted", tracked.name
        )
        tracked.restarted_unseen(now)

    def _check_hits(self, tracked: _Tracked, hits: float | None, now: float) -> None:
        window = tracked.window
        if hits is None:
            return
        if window.hits_at_start is not None and hits < window.hits_at_start:
            self._counter_went_back(tracked, window, now)
        if window.hits_at_start is None or hits < window.hits_at_start:
            tracked.window = _Window(now, hits)
            return
        if now - window.started < self._check_window or window.requests < self._min_requests:
            return
        reported = hits - window.hits_at_start
        block = tracked.index.block_size or tracked.scraped_block_size or 16
        if reported < window.predicted / 2 - 2 * block:
            tracked.facts.disagreement = (
                f"the engine reported {reported:.0f} cached prompt tokens over "
                f"{now - window.started:.0f}s, the index predicted {window.predicted}"
            )
            tracked.clear(ClearReason.DISAGREEMENT)
        elif tracked.facts.disagreement is not None:
            tracked.facts.disagreement = None
            tracked.facts.rebuilding_since = now
            tracked.facts.rebuilding_why = "the engine's hits agree again after a disagreement"
        tracked.window = _Window(now, hits)
