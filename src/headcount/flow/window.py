"""Sliding-window counting: the arithmetic every limits store judges by, and the in-process store.

Each tenant has, per kind (requests, tokens), a counter per fixed window of
`WINDOW` seconds; the count a limit is held to is the previous window's,
weighted by the part of it still inside the last `WINDOW` seconds, plus the
current window's (Cloudflare's sliding window). The functions here are pure
(counts, a limit, how far into the window we are); `MemoryStore` keeps the
counters in this process. The Redis store's Lua script is the same arithmetic,
step for step in the same order, so both give the same verdicts to the bit.
Seconds handed to clients (`reset`, `retry_after`) are rounded up to the
millisecond: never earlier than true.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

from headcount.clock import Clock
from headcount.flow.limits import WINDOW, Charge, Quota, StoreHealth, Verdict

__all__ = [
    "Counts",
    "MemoryStore",
    "fits",
    "judge",
    "position",
    "until_empty",
    "until_fits",
    "weighted",
]

OVER_LIMIT = "tokens_over_limit"


class Counts(NamedTuple):
    """One kind's counters for one tenant: the previous window's and the current one's."""

    previous: int
    current: int


def position(now: float) -> tuple[int, float]:
    """The window `now` falls in, and how far into it (0 at its start, towards 1 at its end)."""
    window = math.floor(now / WINDOW)
    return window, (now - window * WINDOW) / WINDOW


def weighted(counts: Counts, fraction: float) -> float:
    """The sliding count: the previous window's part still inside the last minute, plus now's."""
    return counts.previous * (1 - fraction) + counts.current


def fits(counts: Counts, fraction: float, amount: int, limit: int) -> bool:
    """Whether `amount` more stays within `limit` (0: the limit is off)."""
    return limit <= 0 or weighted(counts, fraction) + amount <= limit


def until_empty(counts: Counts, fraction: float) -> float:
    """Seconds until the sliding count is 0 if nothing more is charged.

    The current window's count fades out over the next window; the previous
    one's is gone at the end of this one.
    """
    if counts.current > 0:
        return (2 - fraction) * WINDOW
    if counts.previous > 0:
        return (1 - fraction) * WINDOW
    return 0.0


def until_fits(counts: Counts, fraction: float, amount: int, limit: int) -> float:
    """Seconds until `amount` more fits within `limit` if nothing more is charged.

    `amount` must not exceed `limit` (else it never fits). The count falls in
    a straight line: within this window as the previous window's part fades,
    then within the next as this window's does.
    """
    if fits(counts, fraction, amount, limit):
        return 0.0
    room = limit - amount
    if counts.current <= room:
        return WINDOW * (1 - fraction - (room - counts.current) / counts.previous)
    return WINDOW * (1 - fraction) + WINDOW * (1 - room / counts.current)


def _ms(seconds: float) -> float:
    return math.ceil(seconds * 1000) / 1000


def _quota(limit: int, counts: Counts, fraction: float) -> Quota | None:
    if limit <= 0:
        return None
    remaining = max(0, math.floor(limit - weighted(counts, fraction)))
    return Quota(limit, remaining, _ms(until_empty(counts, fraction)))


def judge(charge: Charge, requests: Counts, tokens: Counts, now: float) -> Verdict:
    """The verdict on `charge` given its tenant's counts before it, all or nothing.

    The quotas are those after the charge when it is allowed. Refused for a
    charge that can never fit (`tokens_over_limit`), `retry_after` is 0: no
    wait helps.
    """
    window, fraction = position(now)
    rpm, tpm = charge.requests_per_minute, charge.tokens_per_minute
    reason = ""
    if 0 < tpm < charge.tokens:
        reason = OVER_LIMIT
    elif not fits(requests, fraction, 1, rpm):
        reason = "requests_per_minute"
    elif not fits(tokens, fraction, charge.tokens, tpm):
        reason = "tokens_per_minute"
    retry_after = 0.0
    if not reason:
        requests = Counts(requests.previous, requests.current + 1)
        tokens = Counts(tokens.previous, tokens.current + charge.tokens)
    elif reason != OVER_LIMIT:
        retry_after = _ms(
            max(
                until_fits(requests, fraction, 1, rpm) if rpm > 0 else 0.0,
                until_fits(tokens, fraction, charge.tokens, tpm) if tpm > 0 else 0.0,
            )
        )
    return Verdict(
        allowed=not reason,
        requests=_quota(rpm, requests, fraction),
        tokens=_quota(tpm, tokens, fraction),
        retry_after=retry_after,
        window=window,
        reason=reason,
    )


class _Counters:
    """One tenant's four counters, as of `window`."""

    __slots__ = ("requests", "tokens", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.requests = Counts(0, 0)
        self.tokens = Counts(0, 0)

    def roll(self, window: int) -> None:
        """Move on to `window`: the current window becomes the previous one, or both are gone."""
        if window == self.window + 1:
            self.requests = Counts(self.requests.current, 0)
            self.tokens = Counts(self.tokens.current, 0)
        elif window != self.window:
            self.requests = self.tokens = Counts(0, 0)
        self.window = window


class MemoryStore:
    """The counters in this process: exact for one replica, answered at once.

    Memory holds two windows per tenant seen in the last two windows: once a
    window, tenants idle since the one before are forgotten.
    """

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._tenants: dict[str, _Counters] = {}
        self._swept = 0

    def take(self, charge: Charge) -> Verdict:
        now = self._clock()
        counters = self._counters(charge.tenant, position(now)[0])
        verdict = judge(charge, counters.requests, counters.tokens, now)
        if verdict.allowed:
            requests, tokens = counters.requests, counters.tokens
            counters.requests = requests._replace(current=requests.current + 1)
            counters.tokens = tokens._replace(current=tokens.current + charge.tokens)
        return verdict

    def settle(self, tenant: str, window: int, tokens: int) -> None:
        counters = self._counters(tenant, position(self._clock())[0])
        counts = counters.tokens
        if window == counters.window:
            counters.tokens = counts._replace(current=counts.current + tokens)
        elif window == counters.window - 1:
            counters.tokens = counts._replace(previous=counts.previous + tokens)

    @property
    def health(self) -> StoreHealth:
        return StoreHealth("memory", True, None, 0)

    async def close(self) -> None:
        """Nothing to release."""

    def __len__(self) -> int:
        """Tenants whose counters are held."""
        return len(self._tenants)

    def _counters(self, tenant: str, window: int) -> _Counters:
        if window != self._swept:
            self._swept = window
            self._tenants = {
                name: kept for name, kept in self._tenants.items() if kept.window >= window - 1
            }
        counters = self._tenants.get(tenant)
        if counters is None:
            counters = self._tenants[tenant] = _Counters(window)
        counters.roll(window)
        return counters
