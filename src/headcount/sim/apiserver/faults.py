"""The faults a client of the emulator must survive, switched on and off while it runs.

Refusing (ECONNREFUSED), blackholing (connections accepted, nothing
answered), stalling (watch streams silent, LISTs answering), dropping watches
(a clean end or a TCP reset) and compacting (410 for any older
resourceVersion): each is how a real API server, or the network to it, fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from headcount.sim.apiserver.listener import Listener
from headcount.sim.apiserver.store import Store
from headcount.sim.apiserver.watch import end_watches

__all__ = ["Faults"]


class Faults:
    """Which faults are on, and how each is switched on and off (`ApiServerSim` tells what
    each does to a client)."""

    def __init__(self, store: Store, listener: Listener) -> None:
        self.stalled = False
        self.blackholed = False
        self._store = store
        self._listener = listener
        self._unblocked = asyncio.Event()
        self._unblocked.set()
        self._auto_restore: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def silenced(self) -> bool:
        """Watch streams send nothing at all, not even bookmarks."""
        return self.stalled or self.blackholed

    @property
    def refusing(self) -> bool:
        """The API port is closed: connections to it are refused."""
        return not self._listener.listening

    async def until_answering(self) -> None:
        """Return once the server answers requests: at once, unless blackholed."""
        await self._unblocked.wait()

    async def drop_watches(self, *, reset: bool = False) -> None:
        await end_watches(self._store.watches, "abort" if reset else "eof", reset=reset)

    async def refuse(self) -> None:
        await self._listener.refuse()
        await end_watches(self._store.watches, "abort")

    def refuse_for(self, seconds: float) -> None:
        """`refuse` as soon as the current request is answered, then `restore` after `seconds`."""
        self._spawn(self.refuse())
        loop = asyncio.get_running_loop()
        self._auto_restore = loop.call_later(seconds, lambda: self._spawn(self.restore()))

    async def blackhole(self) -> None:
        self.blackholed = True
        self._unblocked.clear()
        self._wake_watches()

    def stall(self) -> None:
        self.stalled = True
        self._wake_watches()

    async def restore(self) -> None:
        if self._auto_restore is not None:
            self._auto_restore.cancel()
            self._auto_restore = None
        self.stalled = self.blackholed = False
        self._unblocked.set()
        await self._listener.restore()
        self._wake_watches()

    def compact(self) -> None:
        self._store.compact()

    def clear(self) -> None:
        """Switch every fault off for good, a pending restore and refusal included: the
        server is stopping."""
        if self._auto_restore is not None:
            self._auto_restore.cancel()
        for task in self._tasks:
            task.cancel()
        self.stalled = self.blackholed = False
        self._unblocked.set()

    def _wake_watches(self) -> None:
        for watch in self._store.watches:
            watch.wake.set()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
