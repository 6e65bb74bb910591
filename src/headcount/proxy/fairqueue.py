"""Waiting work from many clients, handed out a client at a time, in turns: one FIFO per client.

One FIFO for everyone lets a client that queues many costly items delay every
other client by all of them. Here each client has its own FIFO, and clients take
turns: the next item is the oldest of the client whose turn it is. A client newly
waiting goes first (it has had nothing yet: the Virtual Token Counter's rule that
a newly active client starts at the current minimum), and a client served goes
to the back of the line. So a client with one item waits for no more than one
item of each client already waiting, however many they queued, and for none of a
client that was just served. The items of one client and of all are bounded; an
item over a bound is refused, for the caller to answer (the parse pool answers
503 `overloaded`).

    queue = FairQueue[str](per_client=4, total=8)
    queue.push("10.0.0.6", "a1"); queue.push("10.0.0.6", "a2")
    queue.pop()                                    # "a1"
    queue.push("10.0.0.7", "b1")
    queue.pop(), queue.pop()                       # "b1", "a2"
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

__all__ = ["FairQueue"]

_T = TypeVar("_T")


class FairQueue(Generic[_T]):
    """Items by client, handed out in turns between clients; see the module docstring."""

    __slots__ = ("_fresh", "_items", "_size", "_turns", "per_client", "total")

    def __init__(self, per_client: int, total: int) -> None:
        self.per_client = per_client
        """Items one client may have waiting."""
        self.total = total
        """Items all clients together may have waiting."""
        self._items: dict[str, deque[_T]] = {}
        """Each client with items waiting, and its items, oldest first."""
        self._fresh: dict[str, None] = {}
        """The clients not served since they began waiting, in the order they began."""
        self._turns: dict[str, None] = {}
        """The clients served since they began waiting, least recently served first."""
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, client: str, item: _T) -> bool:
        """Queue `item` behind `client`'s others; False (nothing queued) if over a bound."""
        if self._size >= self.total:
            return False
        items = self._items.get(client)
        if items is None:
            items = self._items[client] = deque()
            self._fresh[client] = None
        elif len(items) >= self.per_client:
            return False
        items.append(item)
        self._size += 1
        return True

    def pop(self) -> _T | None:
        """The oldest item of the client whose turn it is, or None if nothing waits."""
        if self._fresh:
            order = self._fresh
        elif self._turns:
            order = self._turns
        else:
            return None
        client = next(iter(order))
        del order[client]
        items = self._items[client]
        item = items.popleft()
        if items:
            self._turns[client] = None
        else:
            del self._items[client]
        self._size -= 1
        return item

    def remove(self, client: str, item: _T) -> None:
        """Take `item` out of `client`'s queue if it is there."""
        items = self._items.get(client)
        if items is None or item not in items:
            return
        items.remove(item)
        self._size -= 1
        if not items:
            del self._items[client]
            self._fresh.pop(client, None)
            self._turns.pop(client, None)
