"""Generation slots, as vLLM's scheduler gives them: at most `max_running` at once, the rest wait.

The running and waiting counts and the KV-cache usage derived from them are
what the engine's metrics report, so a router's load signals come from real
queueing rather than from numbers set by a test.
"""

from __future__ import annotations

import asyncio

__all__ = ["Scheduler"]

_UNLIMITED_KV_SLOTS = 256
"""With no `max_running`, KV usage is running / this: small, but moving with load."""


class Scheduler:
    """Running and waiting requests; enter it to hold a generation slot."""

    def __init__(self, max_running: int | None) -> None:
        self.max_running = max_running
        self.running = 0
        self.waiting = 0
        self._slots = asyncio.Semaphore(max_running) if max_running is not None else None

    @property
    def kv_cache_usage(self) -> float:
        slots = self.max_running or _UNLIMITED_KV_SLOTS
        return min(1.0, self.running / slots)

    async def __aenter__(self) -> None:
        if self._slots is not None:
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
        self.running += 1

    async def __aexit__(self, *exc_info: object) -> None:
        self.running -= 1
        if self._slots is not None:
            self._slots.release()
