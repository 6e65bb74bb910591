"""What every discovery source is and reports: the contract between discovery and health.

A source runs forever, keeps the fleet's engines for its name equal to what it
observes, and records in `SourceStatus` how fresh that observation is, what it
watches (`Watched`) and the objects it matched that are not engines
(`NotAnEngine`, kept beside the fleet, never in it: never probed nor routed to).
Health, `/engines` and metrics read the status; nothing else about a source is
visible to them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["DiscoverySource", "NotAnEngine", "SourceStatus", "Watched"]


@dataclass(frozen=True, slots=True)
class Watched:
    """What a source observes, in the words `/health` explains an empty fleet with."""

    resource: str
    """The objects that become engines: `pods`, `services` or `backends` (static)."""
    namespace: str | None = None
    label_selector: str | None = None
    also: tuple[str, ...] = ()
    """Other resources read beside it (`endpointslices` for Services, `inferencepools` for
    the pods of a pool)."""


@dataclass(frozen=True, slots=True)
class NotAnEngine:
    """An object the source matched that is not an engine now, and why in a word or two.

    Reasons: `pending`, `not ready`, `no IP`, `terminating`, `failed`, `succeeded`,
    `not running` (pods); `no port`, `headless`, `external name` (Services);
    `malformed` (either, the log says how).
    """

    id: str
    name: str
    object_ref: str
    reason: str


@dataclass
class SourceStatus:
    """Freshness of one source, in the clock's seconds (monotonic unless a test injects one).

    Mutated only by the source's own loop; readers copy what they need.
    """

    name: str
    kind: str
    """`static`, `k8s-pods`, `k8s-services`, `inference-pool`."""
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
    failing_since: float | None = None
    """Unix time of the first of the failed attempts since the last successful LIST (else None)."""
    api_unreachable: bool = False
    """The last failed attempt found no API server (refused, reset, timed out)."""
    resource_version: str | None = None
    wall_last_sync: float | None = None
    """Unix time of the last successful LIST or watch event (for the metric timestamp)."""
    can_go_stale: bool = True
    """Whether freshness applies: False for a static list, which has nothing to go stale."""
    watches: Watched | None = None
    missing: str | None = None
    """What the source needs and does not find, so it can have no engine however many objects
    it lists (`inference pool llama not found in namespace llm`); `/health` says it."""
    not_engines: dict[str, NotAnEngine] = field(default_factory=dict)
    """Matched objects that are not engines, by UID: what `/engines` lists beside the fleet."""

    def note(self, uid: str, not_engine: NotAnEngine | None) -> None:
        """Record that the object `uid` is not an engine (why), or no longer a non-engine."""
        if not_engine is None:
            self.not_engines.pop(uid, None)
        else:
            self.not_engines[uid] = not_engine

    def not_engine_counts(self) -> Counter[str]:
        """How many matched objects are not engines, by reason."""
        return Counter(entry.reason for entry in self.not_engines.values())

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
