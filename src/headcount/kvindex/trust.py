"""How far an engine's cache index may be trusted, in the words `/engines` and `/health` use."""

from __future__ import annotations

import enum

__all__ = ["IndexTrust"]


class IndexTrust(enum.StrEnum):
    SYNCED = "synced"
    """Events flowing, no unrecovered gap: the index holds what the engine holds."""
    REBUILDING = "rebuilding"
    """Cleared (or joined late), warming up: what it holds is true, but it may miss blocks."""
    STALE = "stale"
    """It may hold blocks the engine no longer has: routing ignores it for this engine."""
    OFF = "off"
    """No publisher reached: routing by load only for this engine."""

    @property
    def usable(self) -> bool:
        """Whether routing may predict cache hits from the index."""
        return self in (IndexTrust.SYNCED, IndexTrust.REBUILDING)
