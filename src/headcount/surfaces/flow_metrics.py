"""Flow control's series, as one scrape sees them.

With a tenants file, flow control counts each tenant's requests by outcome
(`headcount_tenant_requests_total`), its settled tokens
(`headcount_tenant_tokens_total`) and its time in the router's queue
(`headcount_queue_seconds`) as plain integers on the event loop
(`flow/tally.py`, which also bounds the `tenant` label). At each scrape
`FlowCollector` gets a copy of those counts, made on the loop, with what
waits per priority (`headcount_queue_depth`), each engine's learned capacity
(`headcount_engine_capacity`) and the limits store's state.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
)
from prometheus_client.metrics_core import Metric

from headcount.fleet import Snapshot
from headcount.flow.limits import StoreHealth
from headcount.flow.tally import QUEUE_BUCKETS, TenantCounts
from headcount.surfaces.served import counter_family, histogram_family

__all__ = ["FlowCollector"]


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
        yield counter_family(
            "headcount_tenant_requests",
            "Requests of each tenant by what flow control did with them (admitted: sent on to "
            "an engine; the others are refusals, or the client leaving while queued).",
            ["tenant", "outcome"],
            self._counts.requests,
        )
        yield counter_family(
            "headcount_tenant_tokens",
            "Tokens each tenant used, as the engines reported them (kind: prompt, completion).",
            ["tenant", "kind"],
            self._counts.tokens,
        )
        yield histogram_family(
            "headcount_queue_seconds",
            "Time each admitted request waited in the router's queue (0: it did not).",
            ["tenant"],
            QUEUE_BUCKETS,
            self._counts.waits,
        )
