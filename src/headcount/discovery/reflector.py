"""List+watch one Kubernetes resource forever, so what we hold never silently goes stale.

A `Reflector` owns one loop and one resourceVersion (client-go `tools/cache`):
LIST, hand every object to `on_list` (a full replace: whatever is absent is
gone, DELETE event or not), then WATCH from the list's resourceVersion with
bookmarks and a randomised server timeout, handing each change to `on_event`.
Any end of the watch leads back to a LIST: a reconnect without a relist is how
a pod deleted while we were blind stays registered forever.

It talks to a `ListerWatcher` (`kube.py` in production, a fake in tests),
which raises the tree of `errors.py`. One action per outcome of a watch:

    ended (server timeout, EOF)     relist now               reason `watch-ended`
    WatchExpired                    relist now               reason `expired`
    WatchIdle                       relist now               reason `idle-timeout`
    anything else                   back off, then relist    reason `error`

A watch that ends within `short_watch` without a single event counts as an
error (client-go's `VeryShortWatchError`), so a server that closes at once
cannot make us hot-loop. Back-off grows from `backoff_initial` to `backoff_max`
with jitter and starts over after `backoff_reset_after` without failure.

Unlike client-go, a back-off after the API server could not be reached is cut
short when it answers again (`ListerWatcher.reachable`, polled every
`reachability_poll` with jitter): what we route to must be true within a
second of the API being back, not after the rest of a 30 s back-off. A server
that answers but keeps failing gets the whole back-off.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from headcount.clock import Clock, Sleep
from headcount.discovery.errors import ApiUnreachable, KubeError, WatchExpired, WatchIdle
from headcount.discovery.gc_pause import gc_paused
from headcount.discovery.isolation import Isolation
from headcount.discovery.listwatch import KubeObject, ListerWatcher, WatchEvent, object_key
from headcount.discovery.source import SourceStatus

__all__ = ["OnEvent", "OnList", "Reflector", "ReflectorTiming"]

_log = logging.getLogger(__name__)

_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


class _VeryShortWatch(KubeError):
    """A watch ended almost at once without an event: treated as an error."""


@dataclass(frozen=True)
class ReflectorTiming:
    """How long a reflector waits for what.

    The first four come from `DiscoverySettings` (the wiring maps them); the
    rest are fixed, as in client-go's reflector.
    """

    watch_timeout_min: float
    watch_timeout_max: float
    """Server-side watch timeout drawn in [min, max] so replicas do not relist in lockstep."""
    backoff_initial: float
    backoff_max: float
    backoff_reset_after: float = 120.0
    """client-go: the back-off starts over after two minutes without a failure."""
    short_watch: float = 1.0
    """A watch over this fast without an event is an error, never a reason to hot-loop."""
    remind_every: float = 60.0
    """A loop that keeps failing the same way logs it again this often: never silent."""
    reachability_poll: float = 0.2
    """While the API server is unreachable, how often (times 1-2, jitter) to check it is back."""


OnList = Callable[[list[KubeObject]], None]
OnEvent = Callable[[str, KubeObject], None]


class Reflector:
    """Keeps `on_list`/`on_event` in step with one resource and `status` honest about it."""

    def __init__(
        self,
        lister_watcher: ListerWatcher,
        *,
        status: SourceStatus,
        on_list: OnList,
        on_event: OnEvent,
        label_selector: str,
        timing: ReflectorTiming,
        on_status: Callable[[], None] | None = None,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        """`on_status` is called after every change to `status` (to merge several reflectors)."""
        self.status = status
        self._lw = lister_watcher
        self._on_list = on_list
        self._on_event = on_event
        self._selector = label_selector
        self._timing = timing
        self._on_status = on_status
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._backoff = _Backoff(self._timing, clock, self._rng)
        self._trouble = _Trouble(status.name, clock, self._timing.remind_every)
        self._isolation = Isolation(status.name)
        self._unknown_types: set[str] = set()

    async def run(self) -> None:
        """LIST and WATCH until cancelled; API errors are retried, never raised."""
        reason = "start"
        while True:
            reason = await self._round(reason)

    async def _round(self, reason: str) -> str:
        """One LIST and the WATCH after it; returns why the next LIST happens."""
        try:
            resource_version = await self._list(reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._failed(exc, seen_down=isinstance(exc, ApiUnreachable))
            return "error"
        try:
            return await self._watch(resource_version)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._failed(exc, seen_down=False)
            return "error"

    async def _list(self, reason: str) -> str:
        self.status.relists[reason] += 1
        self._attempt_started()
        try:
            items, resource_version = await self._lw.list(self._selector)
        finally:
            self._attempt_finished()
        with gc_paused():
            self._on_list(items)
        now = self._clock()
        status = self.status
        first = not status.synced
        status.synced = True
        status.last_list_success = now
        status.wall_last_sync = self._wall_clock()
        status.resource_version = resource_version
        status.last_error = None
        status.failing_since = None
        status.api_unreachable = False
        self._touch()
        self._trouble.recovered()
        log = _log.info if first else _log.debug
        log(
            "%s: listed %d objects at resourceVersion %s",
            status.name,
            len(items),
            resource_version,
            extra={"event": "listed", "source": status.name, "objects": len(items)},
        )
        return resource_version

    async def _watch(self, resource_version: str) -> str:
        timeout = self._watch_timeout()
        self._attempt_started()
        started = self._clock()
        events = 0
        ended_by: Exception | None = None
        try:
            async with self._lw.watch(resource_version, timeout, self._selector) as stream:
                self._set_connected(True)
                async for event in stream:
                    events += 1
                    self._handle(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            ended_by = exc
        finally:
            self._set_connected(False)
            self._attempt_finished()
        lasted = self._clock() - started
        if ended_by is not None and not _ends_watch_cleanly(ended_by):
            raise ended_by
        if events == 0 and lasted < self._timing.short_watch:
            cause = f" ({ended_by})" if ended_by is not None else ""
            raise _VeryShortWatch(f"watch ended after {lasted:.2f}s without an event{cause}")
        return self._relist_reason(ended_by, lasted)

    def _relist_reason(self, ended_by: Exception | None, lasted: float) -> str:
        name = self.status.name
        if ended_by is None:
            _log.debug("%s: watch ended after %.1fs; relisting", name, lasted)
            return "watch-ended"
        if _is_expired(ended_by):
            _log.info(
                "%s: watch history expired (%s); relisting",
                name,
                ended_by,
                extra=_fields(name, "relisting", "expired"),
            )
            return "expired"
        idle = _fields(name, "relisting", "idle-timeout")  # a stalled or half-open stream
        _log.info("%s: %s; relisting", name, ended_by, extra=idle)
        return "idle-timeout"

    def _handle(self, event: WatchEvent) -> None:
        if event.type in _CHANGES:
            self._isolation.apply(lambda obj: self._on_event(event.type, obj), event.object)
        elif event.type != "BOOKMARK":
            if event.type not in self._unknown_types:
                self._unknown_types.add(event.type)
                _log.warning(
                    "%s: skipping watch event of unknown type %r",
                    self.status.name,
                    event.type,
                    extra=_fields(self.status.name, "unknown_event", event.type),
                )
            return
        _, version = object_key(event.object)
        status = self.status
        status.last_event = self._clock()
        status.wall_last_sync = self._wall_clock()
        if version:
            status.resource_version = version
        self._touch()

    async def _failed(self, exc: Exception, *, seen_down: bool) -> None:
        """Record a failed round and back off; `seen_down`: a LIST could not reach the API."""
        message, status = _describe(exc), self.status
        status.last_error = message
        status.api_unreachable = isinstance(exc, ApiUnreachable)
        if status.failing_since is None:
            status.failing_since = self._wall_clock()
        self._touch()
        self._trouble.failed(message, unexpected=not isinstance(exc, KubeError))
        delay = self._backoff.next_delay()
        if not isinstance(exc, ApiUnreachable):
            await self._sleep(delay)
            return
        back_off = asyncio.ensure_future(self._sleep(delay))
        came_back = asyncio.ensure_future(self._until_back(seen_down))
        try:
            await asyncio.wait((back_off, came_back), return_when=asyncio.FIRST_COMPLETED)
        finally:
            back_off.cancel()
            came_back.cancel()
        if came_back.done() and not came_back.cancelled():
            name = self.status.name
            back = _fields(name, "relisting", "api-server-back")
            _log.info("%s: API server answers again; relisting now", name, extra=back)

    async def _until_back(self, was_down: bool) -> None:
        """Return once an API server that did not answer answers again.

        A watch broken mid-stream does not prove the server down (a load balancer
        may reset streams of a healthy one): then it must be seen down first.
        """
        while True:
            if await self._lw.reachable():
                if was_down:
                    return
            else:
                was_down = True
            await self._sleep(self._timing.reachability_poll * (1.0 + self._rng.random()))

    def _watch_timeout(self) -> int:
        low, high = self._timing.watch_timeout_min, self._timing.watch_timeout_max
        return max(1, round(self._rng.uniform(low, high)))

    def _attempt_started(self) -> None:
        self.status.last_attempt_started = self._clock()
        self._touch()

    def _attempt_finished(self) -> None:
        self.status.last_attempt_finished = self._clock()
        self._touch()

    def _set_connected(self, connected: bool) -> None:
        self.status.watch_connected = connected
        self._touch()

    def _touch(self) -> None:
        if self._on_status is not None:
            self._on_status()


def _fields(source: str, event: str, reason: str) -> dict[str, str]:
    """A line's fields for JSON logs."""
    return {"event": event, "source": source, "reason": reason}


def _is_expired(exc: Exception) -> bool:
    return isinstance(exc, WatchExpired)


def _is_idle(exc: Exception) -> bool:
    return isinstance(exc, WatchIdle)


def _ends_watch_cleanly(exc: Exception) -> bool:
    """Outcomes that call for a prompt relist rather than a back-off."""
    return _is_expired(exc) or _is_idle(exc)


def _describe(exc: Exception) -> str:
    if isinstance(exc, KubeError):
        return str(exc)
    return f"unexpected {type(exc).__name__}: {exc}"


class _Backoff:
    """Exponential back-off with jitter that starts over after a healthy period."""

    def __init__(self, timing: ReflectorTiming, clock: Clock, rng: random.Random):
        self._timing = timing
        self._clock = clock
        self._rng = rng
        self._base = timing.backoff_initial
        self._last_failure = -math.inf

    def next_delay(self) -> float:
        now = self._clock()
        if now - self._last_failure >= self._timing.backoff_reset_after:
            self._base = self._timing.backoff_initial
        self._last_failure = now
        delay = min(self._base * (1.0 + self._rng.random()), self._timing.backoff_max)
        self._base = min(self._base * 2.0, self._timing.backoff_max)
        return delay


class _Trouble:
    """Logs a failing loop once per distinct error and every `remind_every`, and its recovery.

    A recovery is logged when the failure before it was; a repeat suppressed as
    identical stays quiet on recovery too, so the last line logged is always true.
    """

    def __init__(self, name: str, clock: Clock, remind_every: float) -> None:
        self._name = name
        self._clock = clock
        self._remind_every = remind_every
        self._failing_since: float | None = None
        self._attempts = 0
        self._warned = False
        self._last_message: str | None = None
        self._last_warning = -math.inf

    def failed(self, message: str, *, unexpected: bool) -> None:
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
            self._attempts = 0
        self._attempts += 1
        since = now - self._failing_since
        if message == self._last_message and now - self._last_warning < self._remind_every:
            _log.debug("%s: %s (attempt %d)", self._name, message, self._attempts)
            return
        _log.warning(
            "%s: %s (%d failed attempts in %.1fs; retrying with back-off)",
            self._name,
            message,
            self._attempts,
            since,
            exc_info=unexpected,
            extra=_fields(self._name, "failing", message) | {"attempts": self._attempts},
        )
        self._last_message = message
        self._last_warning = now
        self._warned = True

    def recovered(self) -> None:
        if self._failing_since is None:
            return
        since = self._clock() - self._failing_since
        log = _log.info if self._warned else _log.debug
        log(
            "%s: recovered after %d failed attempts in %.1fs",
            self._name,
            self._attempts,
            since,
            extra={"event": "recovered", "source": self._name, "attempts": self._attempts},
        )
        self._failing_since = None
        self._warned = False
