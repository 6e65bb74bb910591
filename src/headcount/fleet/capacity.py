"""How many requests an engine runs at once, learned from its own gauges (pure).

vLLM runs up to `--max-num-seqs` requests (fewer when their KV blocks do not
fit) and queues the rest: the moment it reports `num_requests_waiting` above
0, `num_requests_running` is what it can run now. That becomes the engine's
capacity. An engine running its whole capacity with nothing waiting may take
more (its prompts got shorter, or it was restarted with a larger batch): the
capacity grows by an eighth (at least one) per such scrape until the engine
queues again. The router counts an engine saturated when its own requests
there reach the capacity; until one is learned, it never is.
"""

from __future__ import annotations

__all__ = ["learn_capacity"]


def learn_capacity(capacity: int | None, running: float, waiting: float) -> int | None:
    """The capacity after one scrape that read `running` and `waiting`."""
    if waiting >= 1:
        return max(1, int(running))
    if capacity is not None and running >= capacity:
        return capacity + max(1, capacity // 8)
    return capacity
