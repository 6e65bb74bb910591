"""Generation slots, as vLLM's scheduler gives them: first come first served, `max_running` at once.

A request may also need resources besides a slot (KV blocks): it says whether
it could take them now (`admit`) and gives them back (`release`). The head of
the queue blocks those behind it, as vLLM's FCFS policy does. A running
request that needs a block none can give preempts the request scheduled last
(`preempt_newest`, vLLM's `running.pop()`): it gives back what it holds,
goes to the head of the queue, counts as waiting, and runs on once admitted
again (`resumed`). The running and waiting counts, and the KV-cache usage
derived from them when the engine simulates no blocks, are what the metrics
report, so a router's load signals come from real queueing rather than from
numbers set by a test.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from typing import Generic, Protocol, TypeVar

__all__ = ["Admittable", "Scheduler"]

_UNLIMITED_KV_SLOTS = 256
"""With no `max_running`, slot-based KV usage is running / this: small, but moving with load."""


class Admittable(Protocol):
    def admit(self) -> bool:
        """Take what the request needs besides a slot; False (taking nothing) if it cannot."""
        ...

    def release(self) -> None:
        """Give back what `admit` took; nothing if it holds nothing."""
        ...


T = TypeVar("T", bound=Admittable)


class Scheduler(Generic[T]):
    """Running and waiting requests; hold `slot(request)` while generating."""

    def __init__(self, max_running: int | None) -> None:
        self.max_running = max_running
        self.running: dict[T, None] = {}
        """Requests holding a slot, in the order they were scheduled (last: newest)."""
        self.preemptions = 0
        """Requests preempted, ever: vLLM's `num_preemptions_total`."""
        self._queue: collections.deque[tuple[T, asyncio.Future[None]]] = collections.deque()
        self._preempted: dict[T, asyncio.Future[None]] = {}

    @property
    def waiting(self) -> list[T]:
        """Requests queued for a slot, first in line first (preempted ones included)."""
        return [request for request, future in self._queue if not future.done()]

    @property
    def kv_cache_usage(self) -> float:
        slots = self.max_running or _UNLIMITED_KV_SLOTS
        return min(1.0, len(self.running) / slots)

    @contextlib.asynccontextmanager
    async def slot(self, request: T) -> AsyncIterator[None]:
        """Wait for `request`'s turn and hold its slot and resources for the block."""
        await self._enter(request)
        try:
            yield
        finally:
            self._leave(request)

    def preempt_newest(self) -> T:
        """Preempt the request scheduled last: it gives back what it holds and waits at the
        head of the queue. The queue is not woken: what it freed is for the running ones."""
        victim = next(reversed(self.running))
        del self.running[victim]
        victim.release()
        future = asyncio.get_running_loop().create_future()
        self._queue.appendleft((victim, future))
        self._preempted[victim] = future
        self.preemptions += 1
        return victim

    async def resumed(self, request: T) -> bool:
        """Wait, if `request` was preempted, until it is admitted again; whether it was."""
        future = self._preempted.get(request)
        if future is None:
            return False
        await future  # cancelled: the slot's exit takes it out of the queue
        return True

    def wake(self) -> None:
        """Admit whoever can start now, in order."""
        self._wake()

    async def _enter(self, request: T) -> None:
        if not self._queue and self._starts(request):
            return
        future = asyncio.get_running_loop().create_future()
        entry = (request, future)
        self._queue.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._leave(request)  # admitted as the cancellation landed
            else:
                with contextlib.suppress(ValueError):  # gone already if `_wake` saw it done
                    self._queue.remove(entry)
                self._wake()
            raise

    def _leave(self, request: T) -> None:
        self.running.pop(request, None)
        preempted = self._preempted.pop(request, None)
        if preempted is not None:
            preempted.cancel()  # out of the queue: `_wake` and `waiting` skip it
        request.release()
        self._wake()

    def _starts(self, request: T) -> bool:
        limit = self.max_running
        if (limit is not None and len(self.running) >= limit) or not request.admit():
            return False
        self.running[request] = None
        return True

    def _wake(self) -> None:
        queue = self._queue
        while queue:
            request, future = queue[0]
            if future.done():
                queue.popleft()
            elif self._starts(request):
                queue.popleft()
                self._preempted.pop(request, None)
                future.set_result(None)
            else:
                break
