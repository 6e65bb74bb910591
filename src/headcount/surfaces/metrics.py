"""Prometheus metrics: hot-path counters kept cheap, fleet state read at scrape time.

Per-request series (`headcount_requests_total`, the latency histograms,
failovers, outlier ejections, the router's own resource errors) live in a
registry and are updated through cached label children; those with a fixed
label set start at zero. Everything that describes the fleet or discovery
(`headcount_engines`, `headcount_engine_in_flight`,
`headcount_outlier_ejected_engines`, `headcount_discovery_*`) is computed from
a snapshot when scraped, so an engine's series disappear with the engine; so
are the `headcount_kv_*` series of the engines' cache indexes, present only with
`--routing kv-aware`. The text is rendered in a worker thread so a scrape never
stalls the event loop. A source that cannot go stale (a static list) is in sync
at every scrape: its `headcount_discovery_last_sync_timestamp_seconds` is the
scrape's time, so freshness alerts never fire for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from headcount.clock import Clock
from headcount.discovery.source import SourceStatus
from headcount.fleet import Snapshot
from headcount.fleet.outliers import REASONS as OUTLIER_REASONS
from headcount.kvindex.stream import ClearReason
from headcount.kvindex.trust import IndexTrust
from headcount.surfaces.kv_views import IndexStatus, KvViews

__all__ = [
    "CLIENT_CLOSED",
    "CONTENT_TYPE",
    "CUT",
    "ERROR",
    "LOCAL_RESOURCES",
    "OK",
    "OUTCOMES",
    "UNKNOWN_MODEL",
    "Metrics",
    "whole",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

UNKNOWN_MODEL = "unknown"
"""The `model` label of requests whose model is unknown: client input must not mint series."""

LOCAL_RESOURCES = ("fds", "memory", "buffers", "connections")
"""The `resource` label of `headcount_local_resource_errors_total` (`connections`: a client
refused over `--max-connections`)."""

OK = "ok"
"""The response reached the client whole, with a status under 500."""
ERROR = "error"
"""The response reached the client whole, with a 5xx (the router's or an engine's)."""
CUT = "cut"
"""The client got a status, then the body broke off (an engine's stream failed)."""
CLIENT_CLOSED = "client_closed"
"""The client left before the response was whole."""
OUTCOMES = (OK, ERROR, CUT, CLIENT_CLOSED)
"""The `outcome` label of `headcount_requests_total`: how the answer ended, beside `code`."""


def whole(status: int) -> str:
    """The outcome of a response that reached the client whole with `status`."""
    return ERROR if status >= 500 else OK


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class Metrics:
    """The router's metrics; one instance per process."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        sources: Sequence[SourceStatus] = (),
        *,
        kv_views: KvViews | None = None,
        wall_clock: Clock = time.time,
    ) -> None:
        """`kv_views`: the engines' cache indexes with `--routing kv-aware`, else None;
        `wall_clock`: Unix time, the last sync of a source that cannot go stale."""
        self._snapshot = snapshot
        self._sources = sources
        self._wall_clock = wall_clock
        self._kv_views = kv_views
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "headcount_requests",
            "Requests answered, by requested model, the HTTP status the client saw (499: none, "
            "it left first) and how the answer ended (outcome: ok, error, cut, client_closed).",
            ["model", "code", "outcome"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "headcount_request_duration_seconds",
            "Time from request received to response complete.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._ttfb = Histogram(
            "headcount_time_to_first_byte_seconds",
            "Time from request received to the first response byte from an engine.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._failovers = Counter(
            "headcount_upstream_failovers",
            "Requests retried on another engine after a failure before the first byte.",
            ["reason"],
            registry=self.registry,
        )
        self._outlier_ejections = Counter(
            "headcount_outlier_ejections",
            "Engines ejected for consecutive 5xx answers or gateway errors, by the kind of the "
            "error that tipped the count.",
            ["reason"],
            registry=self.registry,
        )
        self._local_resource_errors = Counter(
            "headcount_local_resource_errors",
            "Operations that failed for want of the router's own resources (fds, memory, "
            "buffers): never counted against an engine.",
            ["resource"],
            registry=self.registry,
        )
        for reason in OUTLIER_REASONS:
            self._outlier_ejections.labels(reason)
        for resource in LOCAL_RESOURCES:
            self._local_resource_errors.labels(resource)
        self._task_restarts = Counter(
            "headcount_task_restarts",
            "Restarts of a long-lived task (the prober, ...) after it crashed.",
            ["task"],
            registry=self.registry,
        )
        self._children: dict[tuple[str, int, str], tuple[Counter, Histogram, Histogram]] = {}
        self._local_watchers: list[Callable[[str], None]] = []

    def request_done(
        self, model: str, code: int, outcome: str, duration: float, ttfb: float | None
    ) -> None:
        """One request's end: `code` the status the client saw, `outcome` one of `OUTCOMES`."""
        key = (model, code, outcome)
        children = self._children.get(key)
        if children is None:
            if len(self._children) > 10_000:
                # Bound the label cache: model names come from clients.
                self._children.clear()
            children = (
                self._requests.labels(model, str(code), outcome),
                self._duration.labels(model),
                self._ttfb.labels(model),
            )
            self._children[key] = children
        requests, duration_hist, ttfb_hist = children
        requests.inc()
        duration_hist.observe(duration)
        if ttfb is not None:
            ttfb_hist.observe(ttfb)

    def rejected(self, code: int) -> None:
        """A request the HTTP layer refused before it was read whole (400, 413, 431...)."""
        self._requests.labels(UNKNOWN_MODEL, str(code), whole(code)).inc()

    def failover(self, reason: str) -> None:
        self._failovers.labels(reason).inc()

    def outlier_ejected(self, reason: str) -> None:
        self._outlier_ejections.labels(reason).inc()

    def local_resource_error(self, resource: str) -> None:
        """The router ran out of `resource` (one of `LOCAL_RESOURCES`)."""
        self._local_resource_errors.labels(resource).inc()
        for watcher in self._local_watchers:
            watcher(resource)

    def watch_local_resources(self, watcher: Callable[[str], None]) -> None:
        """`watcher(resource)` hears of each `local_resource_error` (for `/health`)."""
        self._local_watchers.append(watcher)

    def task_restarts(self, task: str) -> Callable[[], None]:
        """What to call when `task` is restarted; its series exists (at 0) from now on."""
        return self._task_restarts.labels(task).inc

    async def render(self) -> bytes:
        """The exposition text, built off the event loop from one snapshot."""
        snapshot = self._snapshot()
        fleet = _FleetCollector(snapshot)
        now = self._wall_clock()
        discovery = _DiscoveryCollector([_SourceSample.of(s, now) for s in self._sources])
        collectors: list[_Collector] = [self.registry, fleet, discovery]
        if self._kv_views is not None:
            views = self._kv_views()
            rows = [
                (engine.spec.name, view)
                for engine in snapshot.engines
                if (view := views.get(engine.id)) is not None
            ]
            collectors.append(_KvCollector(rows))
        return await asyncio.to_thread(_render, collectors)


def _render(sources: list[_Collector]) -> bytes:
    return generate_latest(_Union(sources))


class _Union:
    def __init__(self, sources: list[_Collector]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            yield from source.collect()


class _FleetCollector:
    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        engines = GaugeMetricFamily(
            "headcount_engines", "Engines known to the router, by state.", labels=["state"]
        )
        for state, count in self._snapshot.count_by_state().items():
            engines.add_metric([state.value], count)
        yield engines
        in_flight = GaugeMetricFamily(
            "headcount_engine_in_flight",
            "Requests this router has in flight to each engine.",
            labels=["engine"],
        )
        for engine in self._snapshot.engines:
            in_flight.add_metric([engine.spec.name], engine.load.in_flight)
        yield in_flight
        yield GaugeMetricFamily(
            "headcount_outlier_ejected_engines",
            "Engines out of rotation now for an outlier ejection (routed anyway in a panic).",
            value=len(self._snapshot.ejected),
        )


@dataclass(frozen=True, slots=True)
class _SourceSample:
    """A copy of one source's status, taken on the event loop for the render thread."""

    name: str
    wall_last_sync: float | None
    watch_connected: bool
    relists: tuple[tuple[str, int], ...]
    removed_by_relist: int
    can_go_stale: bool

    @classmethod
    def of(cls, status: SourceStatus, now: float) -> _SourceSample:
        """`now`: Unix time, the last sync of a synced source that cannot go stale."""
        in_sync_now = status.synced and not status.can_go_stale
        return cls(
            status.name,
            now if in_sync_now else status.wall_last_sync,
            status.watch_connected,
            tuple(status.relists.items()),
            status.removed_by_relist,
            status.can_go_stale,
        )


class _DiscoveryCollector:
    def __init__(self, samples: list[_SourceSample]) -> None:
        self._samples = samples

    def collect(self) -> Iterator[Metric]:
        last_sync = GaugeMetricFamily(
            "headcount_discovery_last_sync_timestamp_seconds",
            "Unix time of the last successful LIST or watch event, per source "
            "(the scrape's time for a static list, which is always in sync).",
            labels=["source"],
        )
        connected = GaugeMetricFamily(
            "headcount_discovery_watch_connected",
            "1 while the source's watch stream is open.",
            labels=["source"],
        )
        relists = CounterMetricFamily(
            "headcount_discovery_relists",
            "Full re-lists, by source and reason.",
            labels=["source", "reason"],
        )
        removed = CounterMetricFamily(
            "headcount_discovery_reconcile_removed",
            "Engines removed by a re-list: each is a deletion the watch missed.",
            labels=["source"],
        )
        for sample in self._samples:
            if sample.wall_last_sync is not None:
                last_sync.add_metric([sample.name], sample.wall_last_sync)
            if sample.can_go_stale:
                connected.add_metric([sample.name], 1.0 if sample.watch_connected else 0.0)
            for reason, count in sample.relists:
                relists.add_metric([sample.name, reason], count)
            removed.add_metric([sample.name], sample.removed_by_relist)
        yield from (last_sync, connected, relists, removed)


_KV_PER_ENGINE: tuple[
    tuple[
        type[GaugeMetricFamily | CounterMetricFamily],
        str,
        str,
        Callable[[IndexStatus], float | None],
    ],
    ...,
] = (
    (
        GaugeMetricFamily,
        "headcount_kv_index_blocks",
        "KV blocks the engine's index holds.",
        lambda view: view.blocks,
    ),
    (
        GaugeMetricFamily,
        "headcount_kv_index_hints",
        "KV blocks the engine's index keeps as hints after a gap the replay could not fill.",
        lambda view: view.hints,
    ),
    (
        GaugeMetricFamily,
        "headcount_kv_index_memory_bytes",
        "Memory the engine's index is charged: its blocks, hints, and what it has yet to free.",
        lambda view: view.memory_bytes,
    ),
    (
        GaugeMetricFamily,
        "headcount_kv_index_memory_limit_bytes",
        "The engine's index's share of the memory bounds; past it, new blocks are not indexed.",
        lambda view: view.memory_limit_bytes,
    ),
    (
        CounterMetricFamily,
        "headcount_kv_index_refused_blocks",
        "Stored KV blocks not indexed because the engine's index was at its memory bound.",
        lambda view: view.refused_blocks,
    ),
    (
        CounterMetricFamily,
        "headcount_kv_events_applied",
        "KV events applied to the engine's index.",
        lambda view: view.events_applied,
    ),
    (
        CounterMetricFamily,
        "headcount_kv_event_gaps",
        "Gaps in the engine's event sequence (each asks for a replay).",
        lambda view: view.gaps,
    ),
    (
        GaugeMetricFamily,
        "headcount_kv_last_event_age_seconds",
        "Seconds since the engine's last KV event (absent before the first).",
        lambda view: view.last_event_age,
    ),
    (
        CounterMetricFamily,
        "headcount_kv_predicted_cached_tokens",
        "Prompt tokens the index predicted cached on the engine, over the requests sent.",
        lambda view: view.predicted_hit_tokens,
    ),
    (
        CounterMetricFamily,
        "headcount_kv_engine_reported_hit_tokens",
        "The engine's own vllm:prefix_cache_hits_total as last scraped, every router's traffic "
        "(absent while unknown).",
        lambda view: view.reported_hit_tokens,
    ),
)
"""The series with only an `engine` label: family, name, help, and the view's value."""


class _KvCollector:
    """The engines' cache indexes, from views taken on the event loop (frozen: safe to read
    in the render thread)."""

    def __init__(self, rows: list[tuple[str, IndexStatus]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "headcount_kv_index_state",
            "1 for the engine's cache-index trust state (synced, rebuilding, stale, off), "
            "0 for the others; routing uses only synced and rebuilding indexes.",
            labels=["engine", "state"],
        )
        replays = CounterMetricFamily(
            "headcount_kv_replays",
            "Replays asked for a gap, by outcome: filled, or failed (then the index is cleared).",
            labels=["engine", "outcome"],
        )
        clears = CounterMetricFamily(
            "headcount_kv_index_clears",
            "Times the engine's index was emptied, by reason.",
            labels=["engine", "reason"],
        )
        for name, view in self._rows:
            for trust in IndexTrust:
                state.add_metric([name, trust.value], 1.0 if view.trust is trust else 0.0)
            replays.add_metric([name, "filled"], view.replays_filled)
            replays.add_metric([name, "failed"], view.replays_failed)
            for reason in ClearReason:
                clears.add_metric([name, reason.value], view.clears.get(reason, 0))
        yield from (state, replays, clears)
        for family_type, family_name, help_text, value_of in _KV_PER_ENGINE:
            family = family_type(family_name, help_text, labels=["engine"])
            for name, view in self._rows:
                if (value := value_of(view)) is not None:
                    family.add_metric([name], value)
            yield family
