"""The injected clock: what a component that reads or waits on time takes instead of `time`.

Production passes `time.monotonic`, `time.time` and `asyncio.sleep`; a test
passes a fake it controls, so behaviour over minutes of back-off or probe
intervals is checked in no time and without timed assertions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ["Clock", "Sleep"]

Clock = Callable[[], float]
"""Seconds now: `time.monotonic` (or `time.time` for wall-clock stamps), or a test's fake."""

Sleep = Callable[[float], Awaitable[None]]
"""`asyncio.sleep`, or a test's fake that advances a fake clock."""
