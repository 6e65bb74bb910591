"""Flow control's series: per tenant as requests pass, the queue and the store when scraped.

With a tenants file, `TenantMetrics` counts each tenant's requests by outcome
(`headcount_tenant_requests_total`), its settled tokens
(`headcount_tenant_tokens_total`) and its time in the router's queue
(`headcount_queue_seconds`), as plain integers on the event loop: a request
pays a dict lookup and an addition, not a registry's label lookup and lock.
The `tenant` label takes only names the tenants file holds now (`default`
included): any other (a tenant a reload removed) is `other`, so that no input
mints series. At each scrape `FlowCollector` gets a copy of those counts, made
on the loop, with what waits per priority (`headcount_queue_depth`), each
engine's learned capacity (`headcount_engine_capacity`) and the limits
store's state.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from headcount.auth.tenants import Tenant
from headcount.fleet import Snapshot
from headcount.flow.limits import StoreHealth

__all__ = ["OTHER_TENANT", "QUEUE_BUCKETS", "FlowCollector", "TenantCounts", "TenantMetrics"]

OTHER_TENANT = "other"
QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Waits:
    """One tenant's queue-time histogram: a count per bucket (the last is +Inf), the sum."""

    __slots__ = ("buckets", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(QUEUE_BUCKETS) + 1)
        self.total = 0.0


class TenantCounts(NamedTuple):
    """A copy of the counts, taken on the loop for one scrape."""

    requests: dict[tuple[str, str], int]
    tokens: dict[tuple[str, str], int]
    waits: dict[str, tuple[list[int], float]]


class TenantMetrics:
    """Flow control's `FlowMetrics`: per-tenant counts with a bounded `tenant` label."""

    def __init__(self, names: Callable[[], frozenset[str]]) -> None:
        """`names`: the tenants the file in force holds (read again when a name is new)."""
        self._names = names
        self._known: frozenset[str] = frozenset()
        self._labels: dict[int, tuple[Tenant, str]] = {}
        """Per tenant object, its label (a reloaded file's tenants are new objects, labelled
        afresh); keyed by identity, the tenant kept so that its id is not reused."""
        self._outcomes: dict[tuple[str, str], int] = {}
        self._tokens: dict[tuple[str, str], int] = {}
        self._waits: dict[str, _Waits] = {}

    def _label(self, tenant: Tenant) -> str:
        known = self._labels.get(id(tenant))
        if known is not None:
            return known[1]
        if len(self._labels) > 10_000:  # reloads make new tenants: bound the cache
            self._labels.clear()
        name = tenant.name
        if name not in self._known:
            self._known = self._names()
        label = name if name in self._known else OTHER_TENANT
        self._labels[id(tenant)] = (tenant, label)
        return label

    def tenant_request(self, tenant: Tenant, outcome: str) -> None:
        self._count(self._label(tenant), outcome)

    def _count(self, label: str, outcome: str) -> None:
        key = (label, outcome)
        self._outcomes[key] = self._outcomes.get(key, 0) + 1

    def tenant_admitted(self, tenant: Tenant, waited: float) -> None:
        label = self._label(tenant)
        self._count(label, "admitted")
        waits = self._waits.get(label)
        if waits is None:
            waits = self._waits[label] = _Waits()
        if waited:
            waits.buckets[bisect_left(QUEUE_BUCKETS, waited)] += 1
            waits.total += waited
        else:  # most requests: no wait at all
            waits.buckets[0] += 1

    def tenant_tokens(self, tenant: Tenant, prompt: int, completion: int) -> None:
        label, tokens = self._label(tenant), self._tokens
        if prompt:
            key = (label, "prompt")
            tokens[key] = tokens.get(key, 0) + prompt
        if completion:
            key = (label, "completion")
            tokens[key] = tokens.get(key, 0) + completion

    def counts(self) -> TenantCounts:
        """A copy for one scrape's render thread."""
        return TenantCounts(
            dict(self._outcomes),
            dict(self._tokens),
            {label: (list(w.buckets), w.total) for label, w in self._waits.items()},
        )


class FlowCollector:
    """Flow control's series as one scrape sees them."""

    def __init__(
        self, counts: TenantCounts, depths: dict[int, int], snapshot: Snapshot, store: StoreHealth
    ) -> None:
        self._counts = counts
        self._depths = depths
        self._capacities = [
            (engine.spec.name, engine.load.concurrency.value)
            for engine in snapshot.engines
            if engine.load.concurrency.value is not None
        ]
        self._store = store

    def collect(self) -> Iterator[Metric]:
        yield from self._per_tenant()
        depth = GaugeMetricFamily(
            "headcount_queue_depth",
            "Requests waiting in the router for an engine with room, by priority.",
            labels=["priority"],
        )
        for priority, count in sorted(self._depths.items()):
            depth.add_metric([str(priority)], count)
        yield depth
        capacity = GaugeMetricFamily(
            "headcount_engine_capacity",
            "Requests each engine runs at once, as the router learned it from the engine's "
            "running count when it began to queue.",
            labels=["engine"],
        )
        for name, value in self._capacities:
            capacity.add_metric([name], value)
        yield capacity
        yield GaugeMetricFamily(
            "headcount_limits_store_up",
            "1 while the limits store answers (always, in the process), 0 while it fails.",
            value=1 if self._store.ok else 0,
        )
        yield CounterMetricFamily(
            "headcount_limits_store_fail_open",
            "Requests admitted without their limits judged because the store failed.",
            value=self._store.fail_open,
        )

    def _per_tenant(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "headcount_tenant_requests",
            "Requests of each tenant by what flow control did with them (admitted: sent on to "
            "an engine; the others are refusals, or the client leaving while queued).",
            labels=["tenant", "outcome"],
        )
        for (tenant, outcome), count in sorted(self._counts.requests.items()):
            requests.add_metric([tenant, outcome], count)
        yield requests
        tokens = CounterMetricFamily(
            "headcount_tenant_tokens",
            "Tokens each tenant used, as the engines reported them (kind: prompt, completion).",
            labels=["tenant", "kind"],
        )
        for (tenant, kind), count in sorted(self._counts.tokens.items()):
            tokens.add_metric([tenant, kind], count)
        yield tokens
        waits = HistogramMetricFamily(
            "headcount_queue_seconds",
            "Time each admitted request waited in the router's queue (0: it did not).",
            labels=["tenant"],
        )
        for tenant, (buckets, total) in sorted(self._counts.waits.items()):
            cumulative, running = [], 0
            for bound, count in zip((*QUEUE_BUCKETS, float("inf")), buckets, strict=True):
                running += count
                cumulative.append((_bound(bound), running))
            waits.add_metric([tenant], cumulative, total)
        yield waits


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
