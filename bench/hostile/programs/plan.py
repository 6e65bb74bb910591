"""What every hostile attack is given and shares: its plan (target, window, counts) and its marks.

An attack runs between `start_at` and `stop_at` (CLOCK_MONOTONIC, shared by every
process on the machine) and returns a JSON-able summary. An attack made of
stages records when each began (`Marks`), so the report can tell which stage
stalled the router.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

__all__ = ["Marks", "Plan", "Stats", "error_name", "wait_start"]

Stats = dict[str, object]


@dataclass(frozen=True)
class Plan:
    host: str
    port: int
    start_at: float
    stop_at: float
    clients: int
    waves: int
    connections: int
    also_port: int | None = None
    """A second port of the router attacked alike (its `--admin-port`)."""
    count: int = 0
    """Requests in all, for attacks bounded by a count as well as by time."""
    kv_endpoint: str = ""
    """Where an adversarial KV-event publisher binds its PUB socket, `tcp://host:port`."""
    replay_endpoint: str = ""
    """And its replay ROUTER socket."""
    sizes_mib: tuple[float, ...] = ()
    """Sizes of the large KV-event frames, one stage each."""
    blocks: int = 0
    """Blocks a KV-event publisher stores before its tiny frames."""

    def remaining(self, floor: float = 0.01) -> float:
        return max(floor, self.stop_at - time.monotonic())

    def running(self) -> bool:
        return time.monotonic() < self.stop_at


class Marks:
    """When each stage of an attack began: `[[label, t], ...]` in its summary."""

    def __init__(self) -> None:
        self.marks: list[list[object]] = []

    def __call__(self, label: str) -> None:
        self.marks.append([label, time.monotonic()])


async def wait_start(plan: Plan) -> None:
    await asyncio.sleep(max(0.0, plan.start_at - time.monotonic()))


def error_name(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno)
    return type(exc).__name__
