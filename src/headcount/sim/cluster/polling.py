"""Waiting for a condition with a deadline: the one way the harness waits, never a bare sleep.

A simulated cluster converges on its own schedule; whoever drives it polls
what it expects to see and gives up at a deadline, with a message that says
what was awaited.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast, overload

__all__ = ["wait_until"]

T = TypeVar("T")


@overload
async def wait_until(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...


@overload
async def wait_until(
    condition: Callable[[], T], *, timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


async def wait_until(
    condition: Callable[[], object],
    *,
    timeout: float = 5.0,
    interval: float = 0.05,
    what: str = "",
) -> object:
    """Poll `condition` until it returns a truthy value, and return that value.

    `condition` is a plain callable or one whose result is awaited (an HTTP
    call, say). An awaited condition may raise while the system converges:
    the error is kept for the message and polling goes on. A plain one that
    raises ends the wait. After `timeout` seconds: `TimeoutError`.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        value = condition()
        if inspect.isawaitable(value):
            try:
                value = await cast(Awaitable[object], value)
            except Exception as exc:  # the condition may fail while the system converges
                value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            error = f" (last error: {last_error!r})" if last_error is not None else ""
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or condition}{error}")
        await asyncio.sleep(interval)
