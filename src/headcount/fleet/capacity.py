"""How many requests an engine runs at once, learned from its own gauges (pure).

vLLM runs up to `--max-num-seqs` requests (fewer when their KV blocks do not
fit) and queues the rest: the moment it reports `num_requests_waiting` above
0, `num_requests_running` is what it can run now. That becomes the engine's
capacity. An engine running its whole capacity with nothing waiting may take
more (its prompts got shorter, or it was restarted with a larger batch), so
the capacity is raised by an eighth (at least one) to find out, but not at
every scrape: each raise the engine answers by queueing again doubles the
scrapes it must run full before the next one (1, 2, 4 ... `MAX_PATIENCE`), so
an engine at its real limit holds one request in its own queue rarely, not at
every other scrape. The router counts an engine saturated when its own
requests there reach the capacity; until one is learned, it never is.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MAX_PATIENCE", "Capacity", "learn_capacity"]

MAX_PATIENCE = 64
"""Scrapes run full before a raise, at most: about 5 minutes at the default probe interval."""


class Capacity(NamedTuple):
    """What the router knows of an engine's concurrency."""

    value: int | None = None
    """Requests it runs at once; None until it first queues."""
    patience: int = 1
    """Scrapes it must run full, nothing waiting, before the next raise."""
    full: int = 0
    """Such scrapes since the last change."""
    raised: bool = False
    """The last change was a raise: queueing now says it went too far."""


def learn_capacity(known: Capacity, running: float, waiting: float) -> Capacity:
    """What is known after one scrape that read `running` and `waiting`."""
    value = known.value
    if waiting >= 1:
        patience = min(known.patience * 2, MAX_PATIENCE) if known.raised else known.patience
        return Capacity(max(1, int(running)), patience)
    if value is None or running < value:
        return known
    full = known.full + 1
    if full < known.patience:
        return known._replace(full=full)
    return Capacity(value + max(1, value // 8), known.patience, 0, raised=True)
