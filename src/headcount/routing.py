"""Routing policies: given the candidate engines and the request, pick one.

A policy decides and does nothing else: no I/O, no metrics, no clock. The proxy
filters candidates first (model or adapter, routable state, engines already
tried for this request), then asks the policy. `None` means no candidate.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from headcount.fleet import Engine

__all__ = [
    "LeastLoaded",
    "Policy",
    "RequestFeatures",
    "RoundRobin",
    "RoutingName",
    "make_policy",
]


class RoutingName(enum.StrEnum):
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What a policy may read of a request."""

    model: str


class Policy(Protocol):
    """`select` returns one of `candidates`, or None when there is none."""

    name: str

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None: ...


class RoundRobin:
    """Each engine in turn; the cursor is the only state."""

    name = RoutingName.ROUND_ROBIN.value

    def __init__(self) -> None:
        self._cursor = 0

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None:
        if not candidates:
            return None
        self._cursor += 1
        return candidates[self._cursor % len(candidates)]


class LeastLoaded:
    """The engine with the least work: this router's in-flight plus the engine's scraped queue.

    The scrape sees every router replica's traffic, so replicas do not pile onto
    one engine; the in-flight counter reacts between scrapes. Ties go round-robin,
    so an idle fleet is not served by its first engine alone.
    """

    name = RoutingName.LEAST_LOADED.value

    def __init__(self) -> None:
        self._cursor = 0

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None:
        count = len(candidates)
        if count == 0:
            return None
        self._cursor += 1
        start = self._cursor % count
        best: Engine | None = None
        best_score = 0.0
        for offset in range(count):
            engine = candidates[(start + offset) % count]
            score = engine.load.in_flight + engine.running + engine.waiting
            if best is None or score < best_score:
                best, best_score = engine, score
        return best


def make_policy(name: RoutingName) -> Policy:
    if name is RoutingName.LEAST_LOADED:
        return LeastLoaded()
    return RoundRobin()
