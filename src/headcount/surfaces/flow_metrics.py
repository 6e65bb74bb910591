"""Flow control's series: per tenant as requests pass, the queue and the store when scraped.

With a tenants file, `TenantMetrics` counts each tenant's requests by outcome
(`headcount_tenant_requests_total`), its settled tokens
(`headcount_tenant_tokens_total`) and its time in the router's queue
(`headcount_queue_seconds`). The `tenant` label takes only names the tenants
file holds now (`default` included): any other (a tenant a reload removed) is
`other`, so that no input mints series. `FlowCollector` reads at scrape time
what waits per priority (`headcount_queue_depth`), each engine's learned
capacity (`headcount_engine_capacity`) and the limits store's state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from headcount.auth.tenants import Tenant
from headcount.fleet import Snapshot
from headcount.flow.limits import StoreHealth

__all__ = ["OTHER_TENANT", "TENANT_OUTCOMES", "FlowCollector", "TenantMetrics"]

OTHER_TENANT = "other"
TENANT_OUTCOMES = (
    "admitted",
    "rate_limited",
    "concurrency_limited",
    "shed",
    "queue_full",
    "queue_timeout",
    "client_left",
    "no_engine",
)
_QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class TenantMetrics:
    """Flow control's `FlowMetrics`: per-tenant series with a bounded `tenant` label."""

    def __init__(self, registry: CollectorRegistry, names: Callable[[], frozenset[str]]) -> None:
        """`names`: the tenants the file in force holds (read again when it changes)."""
        self._names = names
        self._known: frozenset[str] = frozenset()
        self._requests = Counter(
            "headcount_tenant_requests",
            "Requests of each tenant by what flow control did with them (admitted: sent on to "
            "an engine; the others are refusals, or the client leaving while queued).",
            ["tenant", "outcome"],
            registry=registry,
        )
        self._tokens = Counter(
            "headcount_tenant_tokens",
            "Tokens each tenant used, as the engines reported them (kind: prompt, completion).",
            ["tenant", "kind"],
            registry=registry,
        )
        self._queued = Histogram(
            "headcount_queue_seconds",
            "Time each admitted request waited in the router's queue (0: it did not).",
            ["tenant"],
            buckets=_QUEUE_BUCKETS,
            registry=registry,
        )
        self._children: dict[tuple[Tenant, str], Counter] = {}
        self._waits: dict[Tenant, Histogram] = {}
        self._used: dict[Tenant, tuple[Counter, Counter]] = {}
        """Label children by tenant (a reloaded file's tenants are new keys, labelled
        afresh): `labels()` costs microseconds, a dict lookup does not."""

    def _label(self, tenant: Tenant) -> str:
        if len(self._children) > 10_000:  # bound the caches: reloads make new tenants
            self._children.clear()
            self._waits.clear()
            self._used.clear()
        name = tenant.name
        if name not in self._known:
            self._known = self._names()
        return name if name in self._known else OTHER_TENANT

    def tenant_request(self, tenant: Tenant, outcome: str) -> None:
        key = (tenant, outcome)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._requests.labels(self._label(tenant), outcome)
        child.inc()

    def tenant_queued(self, tenant: Tenant, seconds: float) -> None:
        child = self._waits.get(tenant)
        if child is None:
            child = self._waits[tenant] = self._queued.labels(self._label(tenant))
        child.observe(seconds)

    def tenant_tokens(self, tenant: Tenant, prompt: int, completion: int) -> None:
        children = self._used.get(tenant)
        if children is None:
            label = self._label(tenant)
            children = self._used[tenant] = (
                self._tokens.labels(label, "prompt"),
                self._tokens.labels(label, "completion"),
            )
        if prompt:
            children[0].inc(prompt)
        if completion:
            children[1].inc(completion)


class FlowCollector:
    """The queue, the engines' capacity and the limits store, as one scrape sees them."""

    def __init__(self, depths: dict[int, int], snapshot: Snapshot, store: StoreHealth) -> None:
        self._depths = depths
        self._capacities = [
            (engine.spec.name, engine.load.capacity)
            for engine in snapshot.engines
            if engine.load.capacity is not None
        ]
        self._store = store

    def collect(self) -> Iterator[Metric]:
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
