"""How one emulator listens, paces its watch bookmarks and bounds its history."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ApiServerSimConfig"]


@dataclass(frozen=True)
class ApiServerSimConfig:
    """Where the emulator listens and how it paces bookmarks and keeps history."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port; `ApiServerSim.port` tells which."""
    bookmark_interval: float = 60.0
    """Seconds between BOOKMARK events on watches that allow them (the real server: ~60 s)."""
    history_size: int = 1000
    """Changes kept for watches to resume from; older versions answer 410 Expired."""

    def __post_init__(self) -> None:
        if self.bookmark_interval <= 0:
            raise ValueError("bookmark_interval must be positive")
        if self.history_size < 0:
            raise ValueError("history_size must not be negative")
