"""The per-request series as plain integers render as Prometheus histograms and counters do."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headcount.surfaces.metrics import Metrics
from headcount.surfaces.served import Served
from tests.support import ready_fleet, spec

__all__: list[str] = []


async def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (await metrics.render()).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith(("headcount_request", "headcount_time_to_first_byte"))
    }


async def test_buckets_count_up_to_and_including_their_bound_and_sum_what_was_observed() -> None:
    fleet = ready_fleet(spec("a"))
    metrics = Metrics(lambda: fleet.snapshot)
    metrics.request_done("m", 200, "ok", 0.005, 0.004)
    metrics.request_done("m", 200, "ok", 0.0051, None)
    metrics.request_done("m", 502, "error", 400.0, 0.2)
    metrics.rejected(431)
    samples = await _samples(metrics)

    def duration(le: str) -> float:
        return samples[("headcount_request_duration_seconds_bucket", (("le", le), ("model", "m")))]

    assert (duration("0.005"), duration("0.01"), duration("300.0"), duration("+Inf")) == (
        1,
        2,
        2,
        3,
    )
    total = samples[("headcount_request_duration_seconds_sum", (("model", "m"),))]
    assert total == pytest.approx(0.005 + 0.0051 + 400.0)
    assert samples[("headcount_time_to_first_byte_seconds_count", (("model", "m"),))] == 2
    ok = (("code", "200"), ("model", "m"), ("outcome", "ok"))
    assert samples[("headcount_requests_total", ok)] == 2
    rejected = (("code", "431"), ("model", "unknown"), ("outcome", "ok"))
    assert samples[("headcount_requests_total", rejected)] == 1
    assert not any(labels == (("model", "unknown"),) for _, labels in samples), (
        "a request refused before it was read has no latency"
    )


def test_a_scrape_renders_the_counts_as_they_were_when_it_was_taken() -> None:
    served = Served()
    count, duration, _ = served.series("m", "200", "ok")
    count.n += 1
    duration.observe(0.1)
    taken = served.copy()
    count.n += 1
    served.remove("m")
    values = {
        sample.name: sample.value
        for family in taken.collect()
        for sample in family.samples
        if not sample.labels.get("le")
    }
    assert values["headcount_requests_total"] == 1
    assert values["headcount_request_duration_seconds_count"] == 1
    assert not next(iter(served.copy().collect())).samples
