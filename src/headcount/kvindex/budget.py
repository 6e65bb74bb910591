"""What one engine's event stream may cost per second, as a bucket that refills with time.

An engine chooses what it sends; the router chooses what that may cost it.
A `Budget` holds up to `burst` units and refills at `rate` units a second.
Two ways to spend:

- `take(cost)` spends only what is there: False means "not now" (a replay
  asked for beyond its budget is not asked for);
- `charge(cost)` spends after the fact, into debt if need be (the work of
  a frame is known once it is read); `overdue()` is how long the debt takes
  to repay, which the subscriber waits before reading on. Meanwhile the
  engine's frames queue in ZMQ up to its high-water mark, then the publisher
  drops them: a sequence gap, healed by replay or rebuild like any other.
"""

from __future__ import annotations

from headcount.clock import Clock

__all__ = ["Budget"]


class Budget:
    """Units spent against a rate, with a burst; the clock is injected."""

    __slots__ = ("_at", "_balance", "_clock", "burst", "rate")

    def __init__(self, rate: float, burst: float, clock: Clock) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._balance = burst
        self._at = clock()

    def _refill(self) -> float:
        now = self._clock()
        self._balance = min(self.burst, self._balance + (now - self._at) * self.rate)
        self._at = now
        return self._balance

    def take(self, cost: float) -> bool:
        """Spend `cost` if it is there; False (nothing spent) if not."""
        if self._refill() < cost:
            return False
        self._balance -= cost
        return True

    def charge(self, cost: float) -> None:
        """Spend `cost`, into debt if need be."""
        self._refill()
        self._balance -= cost

    def overdue(self) -> float:
        """Seconds until the debt is repaid; 0 when there is none."""
        balance = self._refill()
        return 0.0 if balance >= 0 else -balance / self.rate
