"""Fake time: a clock that moves only when the test, or a fake sleep, moves it."""

from __future__ import annotations

import asyncio
from typing import Literal

__all__ = ["FakeClock"]

Sleeps = Literal["advance", "stay", "step"]


class FakeClock:
    """Monotonic seconds that move only when told, and a fake sleep that records each wait.

    Pass the clock where code takes a `Clock` (calling it reads `now`) and its
    `sleep` where code takes a `Sleep`. `advance` moves the clock; every sleep
    is recorded in `slept`. What a sleep does is the one choice, `sleeps`:

    - "advance" (the default): it takes no real time, moves the clock by its
      length and yields to the loop once, so back-off is read from `slept`.
    - "stay": it returns at once and the clock stays, so every wait is reckoned
      from the same instant.
    - "step": it blocks until the test moves the clock past its end, so the
      test decides when each sleeper wakes; `advance()` with no argument moves
      to the earliest end, and `sleeping` says whether one waits.

    With `gated=True` every sleep first waits until the test opens `gate`.
    """

    def __init__(
        self, now: float = 1000.0, *, sleeps: Sleeps = "advance", gated: bool = False
    ) -> None:
        self.now = now
        self.sleeps = sleeps
        self.gated = gated
        self.gate = asyncio.Event()
        self.slept: list[float] = []
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.gated:
            await self.gate.wait()
        if self.sleeps == "advance":
            self.now += seconds
            await asyncio.sleep(0)
        elif self.sleeps == "step":
            wake = asyncio.get_running_loop().create_future()
            self._sleepers.append((self.now + seconds, wake))
            await wake

    @property
    def sleeping(self) -> bool:
        """Whether a sleep waits for the clock to be stepped past its end."""
        return self.sleepers > 0

    @property
    def sleepers(self) -> int:
        """How many sleeps wait for the clock to be stepped past their end."""
        return sum(1 for _, wake in self._sleepers if not wake.done())

    def advance(self, seconds: float | None = None) -> None:
        """Move on by `seconds` (None: to the end of the earliest stepped sleep) and wake every
        stepped sleep that ends by then."""
        self._sleepers = [(end, wake) for end, wake in self._sleepers if not wake.done()]
        if seconds is None:
            self.now = min(end for end, _ in self._sleepers)
        else:
            self.now += seconds
        for end, wake in self._sleepers:
            if end <= self.now:
                wake.set_result(None)

    def take(self) -> list[float]:
        """The sleeps recorded since the last `take`, forgetting them."""
        taken, self.slept = self.slept, []
        return taken
