"""The load policies: round-robin, and least-loaded by this router's and the engine's count."""

from __future__ import annotations

from collections.abc import Sequence

from headcount.config import RoutingName
from headcount.fleet import Engine
from headcount.routing.policy import KeySource, RequestFeatures

__all__ = ["LeastLoaded", "RoundRobin"]


class RoundRobin:
    """Each engine in turn; the cursor is the only state."""

    name = RoutingName.ROUND_ROBIN.value
    key_source: KeySource | None = None

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
    key_source: KeySource | None = None

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
            load = engine.load
            score = load.in_flight + load.running + load.waiting
            if best is None or score < best_score:
                best, best_score = engine, score
        return best
