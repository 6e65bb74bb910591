"""The series computed from a snapshot when `/metrics` is scraped, never kept between scrapes.

What describes the fleet (`headcount_engines`, `headcount_engine_in_flight`,
`headcount_outlier_ejected_engines`), discovery (`headcount_discovery_*`) and
the engines' cache indexes (`headcount_kv_*`, with `--routing kv-aware`) is
read from copies taken on the event loop, so an engine's series go with the
engine and the render thread reads nothing that changes under it. A source that
cannot go stale (a static list) is in sync at every scrape: its
`headcount_discovery_last_sync_timestamp_seconds` is the scrape's time, so
freshness alerts never fire for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from headcount.discovery.source import SourceStatus
from headcount.fleet import Snapshot
from headcount.kvindex.stream import ClearReason
from headcount.kvindex.trust import IndexTrust
from headcount.surfaces.kv_views import IndexStatus

__all__ = ["DiscoveryCollector", "FleetCollector", "KvCollector", "SourceSample"]


class FleetCollector:
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
class SourceSample:
    """A copy of one source's status, taken on the event loop for the render thread."""

    name: str
    wall_last_sync: float | None
    watch_connected: bool
    relists: tuple[tuple[str, int], ...]
    removed_by_relist: int
    can_go_stale: bool

    @classmethod
    def of(cls, status: SourceStatus, now: float) -> SourceSample:
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


class DiscoveryCollector:
    def __init__(self, samples: list[SourceSample]) -> None:
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


class KvCollector:
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
