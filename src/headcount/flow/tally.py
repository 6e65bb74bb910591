"""What flow control counts per tenant, as plain integers a request adds to on the loop.

A granted request adds one to its tenant's queue-time histogram (the bucket
of its wait; almost always the first, no wait at all) and, at its end, the
tokens the engine reported; a refused one adds to its outcome. That is a dict
lookup and an addition per request, not a metrics registry's label lookup
and lock: `surfaces/flow_metrics.py` renders a copy at each scrape.

The copy is labelled by tenant name, and only names the tenants file holds
now may be labels, so that no input mints series: what a tenant a reload
removed counts after its last scrape under its own name (a request of it
still in flight, say) goes to tenant `other`. Every series is monotonic: a
tenant's own goes on from where it was should a later reload name it again,
and `other` keeps what it was given.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

from headcount.auth.tenants import OTHER_TENANT

__all__ = ["QUEUE_BUCKETS", "Tallies", "TenantCounts", "TenantTally"]

QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class TenantTally:
    """One tenant's counts."""

    __slots__ = ("completion", "outcomes", "prompt", "waited", "waits")

    def __init__(self) -> None:
        self.waits = [0] * (len(QUEUE_BUCKETS) + 1)
        """Admitted requests per queue-time bucket (the last is +Inf)."""
        self.waited = 0.0
        """Seconds the admitted requests waited, summed."""
        self.outcomes: dict[str, int] = {}
        """Requests not admitted, per outcome (a refusal, or `client_left`)."""
        self.prompt = 0
        self.completion = 0

    def wait(self, seconds: float) -> None:
        """An admitted request waited `seconds` (more than 0) in the queue."""
        self.waits[bisect_left(QUEUE_BUCKETS, seconds)] += 1
        self.waited += seconds

    def refused(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def plus(self, other: TenantTally, sign: int = 1) -> TenantTally:
        """These counts with `other`'s added (`sign` -1: taken away), as a new tally."""
        total = TenantTally()
        total.waits = [
            mine + sign * theirs for mine, theirs in zip(self.waits, other.waits, strict=True)
        ]
        total.waited = self.waited + sign * other.waited
        total.outcomes = dict(self.outcomes)
        for outcome, count in other.outcomes.items():
            total.outcomes[outcome] = total.outcomes.get(outcome, 0) + sign * count
        total.prompt = self.prompt + sign * other.prompt
        total.completion = self.completion + sign * other.completion
        return total


class TenantCounts(NamedTuple):
    """A copy of every tenant's counts, by label, taken on the loop for one scrape."""

    requests: dict[tuple[str, str], int]
    """Per (tenant, outcome): `admitted` and the others."""
    tokens: dict[tuple[str, str], int]
    """Per (tenant, kind): `prompt`, `completion`."""
    waits: dict[tuple[str], tuple[list[int], float]]
    """Per (tenant,), its queue-time buckets and their sum."""


class Tallies(dict[str, TenantTally]):
    """Every tenant's `TenantTally`, by name; a name not seen yet gets an empty one."""

    def __init__(self) -> None:
        super().__init__()
        self._other = TenantTally()
        self._shown: dict[str, TenantTally] = {}
        """Per name, what its own series showed at the last scrape that named it."""
        self._given: dict[str, TenantTally] = {}
        """Per name, what it gave `other` while the file did not name it."""

    def __missing__(self, name: str) -> TenantTally:
        tally = self[name] = TenantTally()
        return tally

    def counts(self, names: frozenset[str]) -> TenantCounts:
        """A copy labelled by the tenants in `names`, and `other`."""
        labelled = []
        empty = TenantTally()
        for name, tally in self.items():
            given = self._given.get(name, empty)
            if name in names:
                shown = self._shown[name] = tally.plus(given, -1)
                labelled.append((name, shown))
            else:  # what it counted since its series last showed goes to `other`
                owed = tally.plus(self._shown.get(name, empty), -1)
                self._other = self._other.plus(owed.plus(given, -1))
                self._given[name] = owed
        counts = TenantCounts({}, {}, {})
        if any(self._other.waits) or self._other.outcomes:
            labelled.append((OTHER_TENANT, self._other))
        for label, tally in labelled:
            counts.requests[(label, "admitted")] = sum(tally.waits)
            for outcome, count in tally.outcomes.items():
                counts.requests[(label, outcome)] = count
            for kind, tokens in (("prompt", tally.prompt), ("completion", tally.completion)):
                if tokens:
                    counts.tokens[(label, kind)] = tokens
            counts.waits[(label,)] = (list(tally.waits), tally.waited)
        return counts
