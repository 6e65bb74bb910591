"""Flow control's series: a bounded tenant label, and what a scrape reads of the queue."""

from __future__ import annotations

from headcount.fleet.capacity import Capacity
from headcount.flow.limits import StoreHealth
from headcount.flow.tally import Tallies
from headcount.surfaces.flow_metrics import FlowCollector
from tests.support.builders import ready_fleet, spec

__all__: list[str] = []


def _samples(collector: FlowCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


def test_a_tenant_the_file_no_longer_names_counts_as_other_and_no_counter_goes_down() -> None:
    tallies = Tallies()
    chat, gone = tallies["chat"], tallies["gone"]
    chat.waits[0] += 1
    chat.prompt, chat.completion = 7, 3
    gone.wait(0.5)
    gone.waits[0] += 1
    gone.wait(99.0)
    tallies["new"].refused("shed")
    fleet = ready_fleet(spec("a"))
    health = StoreHealth("memory", True, None, 0)
    names = frozenset({"default", "chat", "new"})  # a reload removed `gone`
    samples = _samples(FlowCollector(tallies.counts(names), {}, fleet.snapshot, health))

    def sample(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    assert sample("headcount_tenant_requests_total", tenant="chat", outcome="admitted") == 1
    assert sample("headcount_tenant_requests_total", tenant="other", outcome="admitted") == 3
    assert sample("headcount_tenant_requests_total", tenant="gone", outcome="admitted") is None
    assert sample("headcount_tenant_requests_total", tenant="new", outcome="shed") == 1
    assert sample("headcount_tenant_tokens_total", tenant="chat", kind="prompt") == 7
    assert sample("headcount_tenant_tokens_total", tenant="chat", kind="completion") == 3
    assert sample("headcount_queue_seconds_sum", tenant="other") == 99.5
    assert sample("headcount_queue_seconds_count", tenant="other") == 3
    assert sample("headcount_queue_seconds_bucket", tenant="other", le="0.005") == 1
    assert sample("headcount_queue_seconds_bucket", tenant="other", le="0.5") == 2
    assert sample("headcount_queue_seconds_bucket", tenant="other", le="0.25") == 1
    assert sample("headcount_queue_seconds_bucket", tenant="other", le="60.0") == 2
    assert sample("headcount_queue_seconds_bucket", tenant="other", le="+Inf") == 3
    tallies["gone"].waits[0] += 1  # a request of the removed tenant, still in flight
    later = tallies.counts(names)
    assert later.requests[("other", "admitted")] == 4 and ("gone", "admitted") not in later.requests


def test_a_tenant_a_reload_names_again_goes_on_from_where_it_was() -> None:
    tallies = Tallies()
    for _ in range(5):
        tallies["x"].waits[0] += 1
    with_x, without_x = frozenset({"default", "x"}), frozenset({"default"})
    assert tallies.counts(with_x).requests[("x", "admitted")] == 5
    tallies["x"].waits[0] += 2  # while a reload has removed it
    assert tallies.counts(without_x).requests[("other", "admitted")] == 2
    tallies["x"].waits[0] += 1
    assert tallies.counts(without_x).requests[("other", "admitted")] == 3
    tallies["x"].waits[0] += 3  # named again
    again = tallies.counts(with_x).requests
    assert (again[("x", "admitted")], again[("other", "admitted")]) == (8, 3)
    tallies["x"].waits[0] += 1  # removed once more
    assert tallies.counts(without_x).requests[("other", "admitted")] == 4


def test_a_scrape_reads_depths_learned_capacities_and_the_store() -> None:
    fleet = ready_fleet(spec("a"), spec("b"))
    fleet.snapshot.engines[0].load.concurrency = Capacity(6)
    empty = Tallies().counts(frozenset())
    store = StoreHealth("r", False, "x", 4)
    samples = _samples(FlowCollector(empty, {10: 2, -1: 1}, fleet.snapshot, store))
    assert samples == {
        ("headcount_queue_depth", (("priority", "-1"),)): 1,
        ("headcount_queue_depth", (("priority", "10"),)): 2,
        ("headcount_engine_capacity", (("engine", "a"),)): 6,
        ("headcount_limits_store_up", ()): 0,
        ("headcount_limits_store_fail_open_total", ()): 4,
    }
