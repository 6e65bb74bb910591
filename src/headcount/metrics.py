"""Prometheus metrics: hot-path counters kept cheap, fleet state read at scrape time.

Per-request series (`headcount_requests_total`, the latency histograms,
failovers) live in a registry and are updated through cached label children.
Everything that describes the fleet or discovery (`headcount_engines`,
`headcount_engine_in_flight`, `headcount_discovery_*`) is computed from a
snapshot when scraped, so an engine's series disappear with the engine. The
text is rendered in a worker thread so a scrape never stalls the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from headcount.fleet import Snapshot

__all__ = ["CONTENT_TYPE", "Collector", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class Metrics:
    """The router's metrics; one instance per process."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot
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
        self._extra: list[Collector] = []

    def add_collector(self, collector: Collector) -> None:
        """Register a scrape-time collector (discovery sources add theirs)."""
        self._extra.append(collector)

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

    def failover(self, reason: str) -> None:
        self._failovers.labels(reason).inc()

    async def render(self) -> bytes:
        """The exposition text, built off the event loop from one snapshot."""
        state = _FleetCollector(self._snapshot())
        sources: list[Collector] = [self.registry, state, *self._extra]
        return await asyncio.to_thread(_render, sources)


def _render(sources: list[Collector]) -> bytes:
    return generate_latest(_Union(sources))


class _Union:
    def __init__(self, sources: list[Collector]) -> None:
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
