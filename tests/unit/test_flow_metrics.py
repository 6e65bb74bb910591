"""Flow control's series: a bounded tenant label, and what a scrape reads of the queue."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from headcount.auth.tenants import Tenant
from headcount.flow.limits import StoreHealth
from headcount.surfaces.flow_metrics import FlowCollector, TenantMetrics
from tests.support.builders import ready_fleet, spec

__all__: list[str] = []


def test_a_tenant_the_file_no_longer_names_counts_as_other() -> None:
    registry = CollectorRegistry()
    names = {"names": frozenset({"default", "chat"})}
    metrics = TenantMetrics(registry, lambda: names["names"])
    chat, gone = Tenant("chat"), Tenant("gone")
    metrics.tenant_request(chat, "admitted")
    metrics.tenant_request(gone, "admitted")
    metrics.tenant_tokens(chat, 7, 3)
    metrics.tenant_queued(gone, 0.5)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("headcount_tenant_requests_total", tenant="chat", outcome="admitted") == 1
    assert sample("headcount_tenant_requests_total", tenant="other", outcome="admitted") == 1
    assert sample("headcount_tenant_requests_total", tenant="gone", outcome="admitted") is None
    assert sample("headcount_tenant_tokens_total", tenant="chat", kind="prompt") == 7
    assert sample("headcount_tenant_tokens_total", tenant="chat", kind="completion") == 3
    assert sample("headcount_queue_seconds_sum", tenant="other") == 0.5
    names["names"] = frozenset({"default", "chat", "new"})  # a reload adds a tenant
    metrics.tenant_request(Tenant("new", priority=3), "shed")
    assert sample("headcount_tenant_requests_total", tenant="new", outcome="shed") == 1


def test_a_scrape_reads_depths_learned_capacities_and_the_store() -> None:
    fleet = ready_fleet(spec("a"), spec("b"))
    fleet.snapshot.engines[0].load.capacity = 6
    collector = FlowCollector({10: 2, -1: 1}, fleet.snapshot, StoreHealth("r", False, "x", 4))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }
    assert samples == {
        ("headcount_queue_depth", (("priority", "-1"),)): 1,
        ("headcount_queue_depth", (("priority", "10"),)): 2,
        ("headcount_engine_capacity", (("engine", "a"),)): 6,
        ("headcount_limits_store_up", ()): 0,
        ("headcount_limits_store_fail_open_total", ()): 4,
    }
