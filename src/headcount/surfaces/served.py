"""The per-request series as plain integers: `headcount_requests_total` and the two latency
histograms.

Every proxied request adds one to its (model, code, outcome) count and one to a latency
bucket of its model, for its duration and its time to first byte. prometheus-client's
label children did that under a lock each, five increments a request (a third of the
router's Python for metrics); here it is an addition and a bisection on the event loop.
At each scrape `Served.copy` is taken on the loop and rendered in the scrape's thread, as
flow control's counts are (`flow_metrics.py`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

__all__ = [
    "LATENCY_BUCKETS",
    "Count",
    "Latency",
    "Served",
    "ServedCollector",
    "counter_family",
    "histogram_family",
]

_Labels = TypeVar("_Labels", bound=tuple[str, ...])
"""One series' label values, in the family's label order."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Count:
    """One series' count."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class Latency:
    """One model's latency histogram: a count per bucket (the last is +Inf), their sum."""

    __slots__ = ("buckets", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds


class Served:
    """Every model label's series, made when first counted, removed with the label."""

    def __init__(self) -> None:
        self._counts: defaultdict[tuple[str, str, str], Count] = defaultdict(Count)
        self._durations: defaultdict[str, Latency] = defaultdict(Latency)
        self._ttfbs: defaultdict[str, Latency] = defaultdict(Latency)

    def count(self, model: str, code: str, outcome: str) -> Count:
        """The count of (`model`, `code`, `outcome`)."""
        return self._counts[(model, code, outcome)]

    def series(self, model: str, code: str, outcome: str) -> tuple[Count, Latency, Latency]:
        """The count of (`model`, `code`, `outcome`) and `model`'s two histograms."""
        return self._counts[(model, code, outcome)], self._durations[model], self._ttfbs[model]

    def remove(self, model: str) -> None:
        """`model`'s series are gone (its label's room is given back)."""
        for key in [key for key in self._counts if key[0] == model]:
            del self._counts[key]
        self._durations.pop(model, None)
        self._ttfbs.pop(model, None)

    def copy(self) -> ServedCollector:
        """The series as they are now, for a scrape's thread."""
        return ServedCollector(
            {labels: count.n for labels, count in self._counts.items()},
            {(model,): (list(h.buckets), h.total) for model, h in self._durations.items()},
            {(model,): (list(h.buckets), h.total) for model, h in self._ttfbs.items()},
        )


class ServedCollector:
    """A copy of `Served`, rendered in the scrape's thread."""

    def __init__(
        self,
        requests: dict[tuple[str, str, str], int],
        durations: dict[tuple[str], tuple[list[int], float]],
        ttfbs: dict[tuple[str], tuple[list[int], float]],
    ) -> None:
        self._counts = requests
        self._durations = durations
        self._ttfbs = ttfbs

    def collect(self) -> Iterator[Metric]:
        yield counter_family(
            "headcount_requests",
            "Requests answered, by requested model, the HTTP status the client saw (499: none, "
            "it left first) and how the answer ended (outcome: ok, error, cut, client_closed).",
            ["model", "code", "outcome"],
            self._counts,
        )
        yield histogram_family(
            "headcount_request_duration_seconds",
            "Time from request received to response complete.",
            ["model"],
            LATENCY_BUCKETS,
            self._durations,
        )
        yield histogram_family(
            "headcount_time_to_first_byte_seconds",
            "Time from request received to the first response byte from an engine.",
            ["model"],
            LATENCY_BUCKETS,
            self._ttfbs,
        )


def counter_family(
    name: str, documentation: str, labels: list[str], counts: Mapping[_Labels, int]
) -> CounterMetricFamily:
    """A counter with one series per label values in `counts`, in their order."""
    family = CounterMetricFamily(name, documentation, labels=labels)
    for values, count in sorted(counts.items()):
        family.add_metric(list(values), count)
    return family


def histogram_family(
    name: str,
    documentation: str,
    labels: list[str],
    bounds: Sequence[float],
    histograms: Mapping[_Labels, tuple[list[int], float]],
) -> HistogramMetricFamily:
    """A histogram with one series per label values in `histograms`, each a count per
    bucket of `bounds` (the last one +Inf) and their sum."""
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for values, (buckets, total) in sorted(histograms.items()):
        family.add_metric(list(values), _cumulative(bounds, buckets), total)
    return family


def _cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """A histogram's `(le, count)` pairs from a count per bucket (the last one +Inf)."""
    pairs: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        running += count
        pairs.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return pairs
