"""What every discovery source is and reports: the contract between discovery and health.

A source runs forever, keeps the fleet's engines for its name equal to what it
observes, and records in `SourceStatus` how fresh that observation is. Health
and metrics read the status; nothing else about a source is visible to them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["DiscoverySource", "SourceStatus"]


@dataclass
class SourceStatus:
    """Freshness of one source, in the clock's seconds (monotonic unless a test injects one).

    Mutated only by the source's own loop; readers copy what they need.
    """

    name: str
    kind: str
    """`static`, `k8s-pods`, `k8s-services`."""
    synced: bool = False
    """The first full LIST was applied to the fleet."""
    last_list_success: float | None = None
    last_event: float | None = None
    """Last watch event or bookmark received."""
    last_attempt_finished: float | None = None
    """Last LIST or WATCH attempt that ended, successfully or not: proof the loop turns."""
    last_attempt_started: float | None = None
    watch_connected: bool = False
    relists: Counter[str] = field(default_factory=Counter)
    """Relists by reason: start, watch-ended, expired, idle-timeout, error."""
    removed_by_relist: int = 0
    """Engines a LIST removed: each is a deletion the watch missed."""
    last_error: str | None = None
    resource_version: str | None = None
    wall_last_sync: float | None = None
    """Unix time of the last successful LIST or watch event (for the metric timestamp)."""
    can_go_stale: bool = True
    """Whether freshness applies: False for a static list, which has nothing to go stale."""

    @property
    def last_success(self) -> float | None:
        """Freshness: the newest of the last successful LIST and the last watch event."""
        times = [t for t in (self.last_list_success, self.last_event) if t is not None]
        return max(times) if times else None


class DiscoverySource(Protocol):
    """Keeps the fleet's engines of `status.name` equal to what it observes."""

    status: SourceStatus

    async def run(self) -> None:
        """Run until cancelled; never returns on its own, never raises on API errors."""
        ...
