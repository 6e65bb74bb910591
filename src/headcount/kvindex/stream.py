"""The contract between an engine's event subscriber and the index it feeds.

The subscriber (`subscriber.py`) owns the sockets and the sequence; it tells
its sink only what the index must act on, so the index and its trust logic
are tested without ZMQ and the subscriber without an index.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from headcount.kvevents import EventBatch

__all__ = ["ClearReason", "StreamSink", "Subscriber", "SubscriberFactory", "SubscriberTarget"]


class ClearReason(enum.StrEnum):
    """Why an engine's index was emptied: the `reason` label of the clears metric."""

    ALL_BLOCKS_CLEARED = "all_blocks_cleared"
    """The engine said so (its prefix cache was reset)."""
    RESTART = "restart"
    """The sequence went backwards: a new engine process with an empty cache."""
    GAP = "gap"
    """Batches were missed and the replay could not return them."""
    OVERFLOW = "overflow"
    """The index held more blocks than the engine can: removals were missed."""
    DISAGREEMENT = "disagreement"
    """The engine's own hit counter contradicts what the index predicted."""


class StreamSink(Protocol):
    """What an engine's subscriber reports, in order, from one task."""

    def connected(self, up: bool) -> None:
        """The SUB socket reached the publisher (True), or lost it (False)."""

    def batch(self, seq: int, batch: EventBatch) -> None:
        """The next batch in sequence (live, or replayed to fill a gap); a large one comes as
        consecutive calls with the same `seq`, its slices (`kvevents.slices`), the loop
        running between them."""

    def gap(self, expected: int, got: int) -> None:
        """Batches `expected`..`got - 1` were missed; a replay is being asked for."""

    def replayed(self, filled: bool) -> None:
        """The replay for the last gap filled it, or could not (then `clear(GAP)` follows)."""

    def clear(self, reason: ClearReason) -> None:
        """Forget everything the engine held; what follows starts from empty."""

    def confirmed(self, latest: int | None) -> None:
        """The publisher answered the liveness check: batch `latest` (None: none at all) is
        its newest, and every batch up to it was passed on."""

    def unconfirmed(self, why: str) -> None:
        """The liveness check failed (`why`, in words for people): nothing says the stream
        is complete, or that it is not."""


@dataclass(frozen=True, slots=True)
class SubscriberTarget:
    """Where one engine publishes its KV events, and how long a replay may take."""

    endpoint: str
    """The PUB socket, `tcp://host:5557`."""
    replay_endpoint: str
    """The replay ROUTER socket, `tcp://host:5558`."""
    topic: str
    """The subscribed topic prefix (vLLM's default is empty)."""
    replay_timeout: float
    """Seconds a whole replay may take before the gap counts as unfillable."""


class Subscriber(Protocol):
    """One engine's event subscriber: feeds its sink until cancelled."""

    async def run(self) -> None:
        """Subscribe and report to the sink until cancelled; never raises otherwise."""


SubscriberFactory = Callable[[SubscriberTarget, StreamSink], Subscriber]
"""Makes an engine's subscriber (the registry's seam: tests pass a fake)."""
