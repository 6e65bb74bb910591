"""The contract of a limits store: per-tenant request and token counters, reserve then settle.

A store judges one `Charge` (a request and the tokens it reserves) against a
tenant's `requests_per_minute` and `tokens_per_minute`, all or nothing, and
answers a `Verdict` that carries what OpenAI's `x-ratelimit-*` headers say.
Once the engine has said how many tokens the request really used, `settle`
gives back (or takes) the difference. Limits are sliding windows of one
minute: the count of the current minute plus the previous minute's, weighted
by the part of it still inside the last 60 s.

The in-process store is exact for one replica; the Redis store holds one set
of counters for every replica, and fails open (admits, says so in `health`)
when Redis does not answer within its timeout.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable
from typing import NamedTuple, Protocol

__all__ = [
    "WINDOW",
    "Charge",
    "LimitsStore",
    "Quota",
    "StoreHealth",
    "Verdict",
    "ratelimit_headers",
]

WINDOW = 60.0
"""Seconds per window: limits are per minute."""


class Charge(NamedTuple):
    """What one request asks of its tenant's limits (0: that limit is off)."""

    tenant: str
    requests_per_minute: int
    tokens_per_minute: int
    tokens: int
    """Reserved: the prompt's tokens (counted or estimated) plus the most it may generate."""


class Quota(NamedTuple):
    """One limit as the client hears it (OpenAI's `x-ratelimit-{limit,remaining,reset}-*`)."""

    limit: int
    remaining: int
    reset: float
    """Seconds until `remaining` is back to `limit` if nothing more is charged."""


class Verdict(NamedTuple):
    """A store's answer to one charge."""

    allowed: bool
    requests: Quota | None
    """None: no request limit, or the store could not say (failed open)."""
    tokens: Quota | None
    retry_after: float
    """Refused: seconds until the charge would fit (0 when allowed)."""
    window: int
    """The window the charge went to, for `settle`."""
    reason: str
    """Refused: `requests_per_minute`, `tokens_per_minute`, or `tokens_over_limit` (the
    charge alone exceeds the tenant's `tokens_per_minute`); "" when allowed."""


class StoreHealth(NamedTuple):
    """What `/health` and `/metrics` say of a store."""

    name: str
    """`memory`, or the Redis URL without a password."""
    ok: bool
    reason: str | None
    """Why the last call failed (None when ok)."""
    fail_open: int
    """Admissions let through unjudged because the store failed, since start."""


class LimitsStore(Protocol):
    """Where the counters live; see the module docstring."""

    def take(self, charge: Charge) -> Verdict | Awaitable[Verdict]:
        """Judge `charge` and, if allowed, count it; an in-process store answers at once."""

    def settle(self, tenant: str, window: int, tokens: int) -> None:
        """Add `tokens` (negative: give back) to `tenant`'s count in `window`, if that window
        still counts; never waits (a remote store sends it in the background)."""

    @property
    def health(self) -> StoreHealth: ...

    async def close(self) -> None: ...


def ratelimit_headers(verdict: Verdict) -> bytes:
    """OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` lines for `verdict`."""
    lines = b""
    for kind, quota in ((b"requests", verdict.requests), (b"tokens", verdict.tokens)):
        if quota is not None:
            lines += _quota_lines(kind, quota)
    return lines


def _quota_lines(kind: bytes, quota: Quota) -> bytes:
    return b"x-ratelimit-limit-%s: %d\r\nx-ratelimit-remaining-%s: %d\r\n" % (
        kind,
        quota.limit,
        kind,
        quota.remaining,
    ) + b"x-ratelimit-reset-%s: %s\r\n" % (kind, _duration(quota.reset).encode())


def _duration(seconds: float) -> str:
    """A duration as OpenAI writes its resets: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text
