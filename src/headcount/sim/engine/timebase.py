"""The clock and sleep an engine's timing runs on: real ones, or a test's virtual time.

Prefill and token pacing read `now` and wait with `sleep`, so a test can run
the timing model in virtual time and see every wait exactly.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from headcount.clock import Clock, Sleep

__all__ = ["REAL_TIME", "Timebase"]


@dataclass(frozen=True)
class Timebase:
    now: Clock = time.monotonic
    sleep: Sleep = asyncio.sleep


REAL_TIME = Timebase()
