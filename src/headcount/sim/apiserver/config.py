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
    admin_port: int | None = None
    """A second port serving only the ``/_sim/`` API, which no fault touches (a refusal
    closes the API port, so a cluster can still change while clients are blind); 0 picks a
    free port, None opens none."""

    kubelet: bool = False
    """Start new pods as a kubelet would (`kubelet.Kubelet`): IP, Running, Ready."""
    kubelet_delay: float = 1.0
    """Seconds from a pod's creation to its start, as a kubelet pulling an image takes."""
    kubelet_addresses: tuple[str, ...] = tuple(f"127.0.0.{n}" for n in range(11, 251))
    """The pod IPs the kubelet hands out, lowest free first (loopback: sim engines listen)."""

    def __post_init__(self) -> None:
        if self.bookmark_interval <= 0:
            raise ValueError("bookmark_interval must be positive")
        if self.kubelet_delay < 0:
            raise ValueError("kubelet_delay must not be negative")
        if self.history_size < 0:
            raise ValueError("history_size must not be negative")
