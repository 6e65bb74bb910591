"""Test helpers shared across the suite: polling with a deadline, free ports."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["free_port", "wait_until", "wait_until_async"]

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_until(
    condition: Callable[[], T], *, timeout: float = 5.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll `condition` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await asyncio.sleep(interval)


async def wait_until_async(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout: float = 5.0,
    interval: float = 0.05,
    what: str = "",
) -> T:
    """Like `wait_until`, for a condition that must be awaited (an HTTP call, say)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = await condition()
            if value:
                return value
        except Exception as exc:  # the condition may fail while the system converges
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or condition} (last error: {last_error!r})"
            )
        await asyncio.sleep(interval)
