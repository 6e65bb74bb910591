"""Prometheus metrics: hot-path counters kept cheap, fleet state read at scrape time.

Per-request series (`headcount_requests_total`, the latency histograms,
failovers) live in a registry and are updated through cached label children.
Everything that describes the fleet, discovery or the router's own resources
(`headcount_engines`, `headcount_engine_in_flight`, `headcount_discovery_*`,
`headcount_local_resource_errors_total`) is computed from a snapshot when
scraped, so an engine's series disappear with the engine. The text is rendered
in a worker thread so a scrape never stalls the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from headcount.discovery.source import SourceStatus
from headcount.fleet import Snapshot

__all__ = ["CONTENT_TYPE", "UNKNOWN_MODEL", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

UNKNOWN_MODEL = "unknown"
"""The `model` label of requests whose model is unknown: client input must not mint series."""

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class Metrics:
    """The router's metrics; one instance per process."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        sources: Sequence[SourceStatus] = (),
        local_errors: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """`local_errors()`: the router's own resources running out, counted by resource."""
        self._snapshot = snapshot
        self._sources = sources
        self._local_errors = local_errors
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "headcount_requests",
            "Requests answered, by requested model and HTTP status.",
            ["model", "code"],
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
        self._children: dict[tuple[str, int], tuple[Counter, Histogram, Histogram]] = {}

    def request_done(self, model: str, code: int, duration: float, ttfb: float | None) -> None:
        children = self._children.get((model, code))
        if children is None:
            if len(self._children) > 10_000:
                # Bound the label cache: model names come from clients.
                self._children.clear()
            children = (
                self._requests.labels(model, str(code)),
                self._duration.labels(model),
                self._ttfb.labels(model),
            )
            self._children[(model, code)] = children
        requests, duration_hist, ttfb_hist = children
        requests.inc()
        duration_hist.observe(duration)
        if ttfb is not None:
            ttfb_hist.observe(ttfb)

    def rejected(self, code: int) -> None:
        """A request the HTTP layer refused before it was read whole (400, 413, 431...)."""
        self._requests.labels(UNKNOWN_MODEL, str(code)).inc()

    def failover(self, reason: str) -> None:
        self._failovers.labels(reason).inc()

    async def render(self) -> bytes:
        """The exposition text, built off the event loop from one snapshot."""
        fleet = _FleetCollector(self._snapshot())
        discovery = _DiscoveryCollector([_SourceSample.of(s) for s in self._sources])
        collectors: list[_Collector] = [self.registry, fleet, discovery]
        if self._local_errors is not None:
            collectors.append(_LocalErrorsCollector(dict(self._local_errors())))
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


class _LocalErrorsCollector:
    def __init__(self, counts: dict[str, int]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "headcount_local_resource_errors",
            "The router's own resources running out (file descriptors, the connection limit), "
            "by resource; never counted against an engine.",
            labels=["resource"],
        )
        for name, count in sorted(self._counts.items()):
            errors.add_metric([name], count)
        yield errors


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
    def of(cls, status: SourceStatus) -> _SourceSample:
        return cls(
            status.name,
            status.wall_last_sync,
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
            "Unix time of the last successful LIST or watch event, per source.",
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
