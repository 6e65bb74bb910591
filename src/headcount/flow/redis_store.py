"""The limits' counters in Redis, shared by every replica, judged in one round trip.

One Lua script reads a tenant's four counters (requests and tokens, the
previous and the current window), judges the charge with `window.py`'s
arithmetic written again in Lua, step for step, and counts it if allowed: one
`EVALSHA`, atomic, so replicas never admit past a limit between a read and a
write. The window is reckoned from Redis's own `TIME`, so replicas with skewed
clocks agree. Keys are `headcount:limits:{TENANT}:r:<window>` (and `:t:`),
the tenant a Redis Cluster hash tag, and expire on their own after 2.5
windows.

When Redis is down, refuses, errs or does not answer within `timeout`, `take`
admits the charge unjudged (fail-open): its verdict has no quotas and goes to
no window (`UNCOUNTED`; settling it does nothing), and `health` says why until
the next call succeeds. Needs Redis 5 or later (scripts replicated by their
effects, so `TIME` may precede writes).
"""

from __future__ import annotations

import asyncio
import math

from headcount.clock import Clock
from headcount.config import redis_address
from headcount.flow.limits import WINDOW, Charge, Quota, StoreHealth, Verdict
from headcount.flow.resp import (
    Arg,
    RedisUnavailable,
    Reply,
    RespClient,
    RespError,
    RespProtocolError,
    Script,
)

__all__ = ["UNCOUNTED", "RedisStore"]

UNCOUNTED = -1
"""The window of a charge admitted unjudged: it was counted nowhere."""

TTL = math.ceil(2.5 * WINDOW)
"""Seconds a counter lives after its last write: a window's count is read until two
windows after it starts."""

_NOW = """
local span, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) + tonumber(time[2]) / 1000000
end
local window = math.floor(now / span)
local fraction = (now - window * span) / span
local prefix = KEYS[1]
"""
"""Both scripts' start: ARGV[3] is a time that only tests give; otherwise Redis's clock."""

_TAKE = Script(
    _NOW
    + """
local rpm, tpm, tokens = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

local function weighted(previous, current)
  return previous * (1 - fraction) + current
end
local function fits(previous, current, amount, limit)
  return limit <= 0 or weighted(previous, current) + amount <= limit
end
local function until_empty(previous, current)
  if current > 0 then return (2 - fraction) * span end
  if previous > 0 then return (1 - fraction) * span end
  return 0
end
local function until_fits(previous, current, amount, limit)
  if fits(previous, current, amount, limit) then return 0 end
  local room = limit - amount
  if current <= room then
    return span * (1 - fraction - (room - current) / previous)
  end
  return span * (1 - fraction) + span * (1 - room / current)
end
local function quota(limit, previous, current)
  if limit <= 0 then return {-1, -1} end
  return {math.max(0, math.floor(limit - weighted(previous, current))),
          math.ceil(until_empty(previous, current) * 1000)}
end

local r_key, t_key = prefix .. 'r:' .. window, prefix .. 't:' .. window
local counts = redis.call('MGET', prefix .. 'r:' .. (window - 1), r_key,
                          prefix .. 't:' .. (window - 1), t_key)
local r_prev, r_cur = tonumber(counts[1] or '0'), tonumber(counts[2] or '0')
local t_prev, t_cur = tonumber(counts[3] or '0'), tonumber(counts[4] or '0')

local reason = ''
if tpm > 0 and tokens > tpm then
  reason = 'tokens_over_limit'
elseif not fits(r_prev, r_cur, 1, rpm) then
  reason = 'requests_per_minute'
elseif not fits(t_prev, t_cur, tokens, tpm) then
  reason = 'tokens_per_minute'
end
local retry = 0
if reason == '' then
  r_cur = redis.call('INCR', r_key)
  redis.call('EXPIRE', r_key, ttl)
  t_cur = redis.call('INCRBY', t_key, tokens)
  redis.call('EXPIRE', t_key, ttl)
elseif reason ~= 'tokens_over_limit' then
  local r_wait, t_wait = 0, 0
  if rpm > 0 then r_wait = until_fits(r_prev, r_cur, 1, rpm) end
  if tpm > 0 then t_wait = until_fits(t_prev, t_cur, tokens, tpm) end
  retry = math.ceil(math.max(r_wait, t_wait) * 1000)
end
local r_quota, t_quota = quota(rpm, r_prev, r_cur), quota(tpm, t_prev, t_cur)
return {reason, window, r_quota[1], r_quota[2], t_quota[1], t_quota[2], retry}
"""
)
"""ARGV[4:]: requests_per_minute, tokens_per_minute, tokens. Returns the reason refused
("" allowed), the window, each quota's remaining and reset (ms), retry_after (ms)."""

_SETTLE = Script(
    _NOW
    + """
local target = tonumber(ARGV[4])
if target ~= window and target ~= window - 1 then return 0 end
local key = prefix .. 't:' .. target
redis.call('INCRBY', key, ARGV[5])
redis.call('EXPIRE', key, ttl)
return 1
"""
)
"""ARGV[4:]: the window, the tokens to add; nothing once that window no longer counts."""

_UNJUDGED = Verdict(True, None, None, 0.0, UNCOUNTED, "")

_FAILURES = (RedisUnavailable, RespError, RespProtocolError)


class RedisStore:
    """`LimitsStore` on the Redis at `url`, every call bounded by `timeout` seconds.

    `clock` is for tests only: it replaces Redis's clock so a test can step
    time. At most `max_settling` settles wait for Redis at once; past that,
    and when a settle fails, it is dropped and counted in `settle_failures`
    (the tenant keeps the reservation: the safe side).
    """

    def __init__(
        self,
        url: str,
        timeout: float,
        *,
        clock: Clock | None = None,
        max_settling: int = 1024,
    ) -> None:
        host, port, db = redis_address(url)
        self._client = RespClient(host, port, db=db, timeout=timeout)
        self._url = url
        self._clock = clock
        self._max_settling = max_settling
        self._settling: set[asyncio.Task[None]] = set()
        self._reason: str | None = None
        self._fail_open = 0
        self._settle_failures = 0

    async def take(self, charge: Charge) -> Verdict:
        limits = (charge.requests_per_minute, charge.tokens_per_minute, charge.tokens)
        try:
            reply = await self._client.evalsha(
                _TAKE, [_prefix(charge.tenant)], [*self._common(), *limits]
            )
            verdict = _verdict(charge, reply)
        except _FAILURES as exc:
            self._reason = str(exc)
            self._fail_open += 1
            return _UNJUDGED
        self._reason = None
        return verdict

    def settle(self, tenant: str, window: int, tokens: int) -> None:
        if window == UNCOUNTED or tokens == 0:
            return
        if len(self._settling) >= self._max_settling:
            self._settle_failures += 1
            return
        args = [*self._common(), window, tokens]
        task = asyncio.get_running_loop().create_task(self._settle(_prefix(tenant), args))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    @property
    def health(self) -> StoreHealth:
        reason = None if self._reason is None else f"{self._url}: {self._reason}"
        return StoreHealth(self._url, reason is None, reason, self._fail_open)

    @property
    def settle_failures(self) -> int:
        """Settles dropped, because Redis failed or too many were waiting, since start."""
        return self._settle_failures

    async def drain(self) -> None:
        """Wait for the settles sent so far (each bounded by the timeout)."""
        if self._settling:
            await asyncio.wait(set(self._settling))

    async def close(self) -> None:
        await self.drain()
        await self._client.close()

    async def _settle(self, prefix: str, args: list[Arg]) -> None:
        try:
            await self._client.evalsha(_SETTLE, [prefix], args)
        except _FAILURES as exc:
            self._reason = str(exc)
            self._settle_failures += 1
        else:
            self._reason = None

    def _common(self) -> list[Arg]:
        return [WINDOW, TTL, "" if self._clock is None else repr(self._clock())]


def _prefix(tenant: str) -> str:
    return f"headcount:limits:{{{tenant}}}:"


def _verdict(charge: Charge, reply: Reply) -> Verdict:
    match reply:
        case [
            bytes() as reason,
            int() as window,
            int() as requests_left,
            int() as requests_reset,
            int() as tokens_left,
            int() as tokens_reset,
            int() as retry_after,
        ]:
            return Verdict(
                allowed=not reason,
                requests=_quota(charge.requests_per_minute, requests_left, requests_reset),
                tokens=_quota(charge.tokens_per_minute, tokens_left, tokens_reset),
                retry_after=retry_after / 1000,
                window=window,
                reason=reason.decode(),
            )
    raise RespProtocolError(f"the limits script answered {reply!r:.80}")


def _quota(limit: int, remaining: int, reset_ms: int) -> Quota | None:
    return Quota(limit, remaining, reset_ms / 1000) if limit > 0 else None
