"""Prometheus metrics: hot-path counters kept cheap, fleet state read at scrape time.

The per-request series (`headcount_requests_total` and the latency
histograms) are plain integers on the event loop (`served.py`), copied at each
scrape; the rarer ones (failovers, outlier ejections, the router's own
resource errors, task restarts) live in a registry, and those with a fixed
label set start at zero. Everything that describes the fleet, discovery or the
cache indexes is computed from a snapshot when scraped (`scraped.py`), so an
engine's series disappear with the engine. The text is rendered in a worker
thread so a scrape never stalls the event loop.

The `model` label takes only models some engine serves (a client's unknown
model is `unknown`), but an engine chooses what it serves: one advertising
thousands of adapters would mint dozens of series for each. At most
`MAX_MODEL_LABELS` models have series of their own; when the set is full, the
series of models no engine serves any more are removed to make room, and a
model that still finds none is counted as `other`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from headcount.clock import Clock
from headcount.discovery.source import SourceStatus
from headcount.fleet import Snapshot
from headcount.fleet.outliers import REASONS as OUTLIER_REASONS
from headcount.surfaces.kv_views import KvViews
from headcount.surfaces.scraped import DiscoveryCollector, FleetCollector, KvCollector, SourceSample
from headcount.surfaces.served import Count, Latency, Served

__all__ = [
    "CLIENT_CLOSED",
    "CONTENT_TYPE",
    "CUT",
    "ERROR",
    "LOCAL_RESOURCES",
    "MAX_MODEL_LABELS",
    "OK",
    "OTHER_MODELS",
    "OUTCOMES",
    "RESUMED",
    "RESUME_FAILED",
    "RETRIED",
    "UNKNOWN_MODEL",
    "Metrics",
    "whole",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

UNKNOWN_MODEL = "unknown"
"""The `model` label of requests whose model is unknown: client input must not mint series."""
OTHER_MODELS = "other"
"""The `model` label of served models over `MAX_MODEL_LABELS`: engine input must not either."""
MAX_MODEL_LABELS = 200
"""Models with series of their own: a fleet's base models and the adapters in daily use fit
(each model costs about 40 series: 2 histograms and its codes)."""

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
RESUMED = "resumed"
"""The stream broke and was resumed on another engine, then reached the client whole (also
the `outcome` of `headcount_stream_resumes_total` for each continuation that began)."""
RESUME_FAILED = "failed"
"""`headcount_stream_resumes_total`: a continuation that failed before its first event."""
RETRIED = "retried"
"""`headcount_stream_resumes_total`: an unstreamed answer that broke before the client got
any of it, asked again whole of another engine."""
OUTCOMES = (OK, ERROR, CUT, CLIENT_CLOSED, RESUMED)
"""The `outcome` label of `headcount_requests_total`: how the answer ended, beside `code`."""


def whole(status: int) -> str:
    """The outcome of a response that reached the client whole with `status`."""
    return ERROR if status >= 500 else OK


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
        max_models: int = MAX_MODEL_LABELS,
    ) -> None:
        """`kv_views`: the engines' cache indexes with `--routing kv-aware`, else None;
        `wall_clock`: Unix time, the last sync of a source that cannot go stale;
        `max_models`: models with series of their own."""
        self._snapshot = snapshot
        self._sources = sources
        self._wall_clock = wall_clock
        self._kv_views = kv_views
        self.registry = CollectorRegistry(auto_describe=True)
        self._served = Served()
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
        self._resumes = Counter(
            "headcount_stream_resumes",
            "Broken streams continued on another engine (resumed), continuations that failed "
            "before their first event (failed), broken streams cut instead, by why "
            "(refused_<reason>), and unstreamed answers asked again whole (retried).",
            ["model", "outcome"],
            registry=self.registry,
        )
        self._resume_gaps = Histogram(
            "headcount_stream_resume_gap_seconds",
            "The silence a client saw at a resumed stream's seam: from the last byte of the "
            "engine that failed to the first of the next.",
            ["model"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self._children: dict[tuple[str, int, str], tuple[Count, Latency, Latency]] = {}
        self._labelled: set[str] = set()
        """The models with series of their own."""
        self._max_models = max_models
        self._local_watchers: list[Callable[[str], None]] = []
        self._scraped_also: list[Callable[[Snapshot], _Collector]] = []

    def request_done(
        self, model: str, code: int, outcome: str, duration: float, ttfb: float | None
    ) -> None:
        """One request's end: `code` the status the client saw, `outcome` one of `OUTCOMES`."""
        key = (model, code, outcome)
        children = self._children.get(key)
        if children is None:
            if len(self._children) > 10_000:
                # Bound the label cache: every served model and code may come by.
                self._children.clear()
            children = self._children[key] = self._series(model, str(code), outcome)
        count, duration_series, ttfb_series = children
        count.n += 1
        duration_series.observe(duration)
        if ttfb is not None:
            ttfb_series.observe(ttfb)

    def _series(self, model: str, code: str, outcome: str) -> tuple[Count, Latency, Latency]:
        return self._served.series(self._label(model), code, outcome)

    def _label(self, model: str) -> str:
        """`model`'s label: its own while `max_models` allows, else `other`."""
        if model == UNKNOWN_MODEL:
            return model
        if model not in self._labelled and len(self._labelled) >= self._max_models:
            self._forget_unserved()
        if model in self._labelled or len(self._labelled) < self._max_models:
            self._labelled.add(model)
            return model
        return OTHER_MODELS

    def _forget_unserved(self) -> None:
        """Remove the series of every labelled model no engine serves now."""
        snapshot = self._snapshot()
        for model in [model for model in self._labelled if not snapshot.is_known(model)]:
            self._labelled.discard(model)
            self._served.remove(model)
        self._children.clear()

    def rejected(self, code: int) -> None:
        """A request the HTTP layer refused before it was read whole (400, 413, 431...)."""
        self._served.count(UNKNOWN_MODEL, str(code), whole(code)).n += 1

    def stream_resumed(self, model: str, outcome: str, gap: float | None = None) -> None:
        """A broken stream's fate (`RESUMED`, `RESUME_FAILED`, `refused_<reason>`); `gap`,
        the seconds its client heard nothing at the seam of a resumed one."""
        label = self._label(model)
        self._resumes.labels(label, outcome).inc()
        if gap is not None:
            self._resume_gaps.labels(label).observe(gap)

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

    def scrape_also(self, collector: Callable[[Snapshot], _Collector]) -> None:
        """At each scrape, `collector(snapshot)` (made on the loop) adds its series too."""
        self._scraped_also.append(collector)

    def sample(self, name: str, labels: dict[str, str]) -> float | None:
        """The value of one sample as a scrape would see it now (None: no such sample)."""
        for family in _Union([self.registry, self._served.copy()]).collect():
            for found in family.samples:
                if found.name == name and found.labels == labels:
                    return found.value
        return None

    async def render(self) -> bytes:
        """The exposition text, built off the event loop from one snapshot."""
        snapshot = self._snapshot()
        fleet = FleetCollector(snapshot)
        now = self._wall_clock()
        discovery = DiscoveryCollector([SourceSample.of(s, now) for s in self._sources])
        collectors: list[_Collector] = [self.registry, self._served.copy(), fleet, discovery]
        if self._kv_views is not None:
            views = self._kv_views()
            rows = [
                (engine.spec.name, view)
                for engine in snapshot.engines
                if (view := views.get(engine.id)) is not None
            ]
            collectors.append(KvCollector(rows))
        collectors.extend(collector(snapshot) for collector in self._scraped_also)
        return await asyncio.to_thread(_render, collectors)


def _render(sources: list[_Collector]) -> bytes:
    return generate_latest(_Union(sources))


class _Union:
    def __init__(self, sources: list[_Collector]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            yield from source.collect()
