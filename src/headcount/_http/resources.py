"""The router's own resources: limits set at start, and running out made visible.

At start the soft open-file limit is raised to the hard one, and large allocations
are made to go back to the system when freed (`release_large_allocations`).

Running out of file descriptors (EMFILE, ENFILE), socket buffers (ENOBUFS) or
memory (ENOMEM), or reaching `--max-connections`, is the router's condition,
not an engine's. What the client side meets (an accept that fails, a
connection over the cap) is reported here: logged at most once a minute per
resource and counted through `count` (the metric
`headcount_local_resource_errors_total{resource}`). Every such event, wherever
it was counted (engine connections and probes count theirs in the metric),
reaches `seen`, so that `problems()` names, for a minute after the last one,
each resource the router ran out of: `/health` then says `degraded` and why.
Nothing here touches an engine's state.
"""

from __future__ import annotations

import ctypes
import logging
import resource
import time
from collections.abc import Callable

from headcount._http.errors import local_resource
from headcount.log_limit import LogLimit

__all__ = ["LocalResources", "raise_open_file_limit", "release_large_allocations"]

_log = logging.getLogger(__name__)

_WINDOW = 60.0
"""How long one exhaustion stays in `/health`, and the least time between two log lines."""
_NAMES = {
    "fds": "file descriptors",
    "memory": "memory",
    "buffers": "socket buffers",
    "connections": "client connections (--max-connections)",
}


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (logged when it moves); the soft limit now.

    Containers often start with a soft limit of 1024 under a hard one of 1M: every
    client and engine connection is a descriptor, and the soft limit is what fails.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as error:
        _log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, error)
        return soft
    _log.info("open-file limit raised from %d to %d", soft, hard)
    return hard


_M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter for the mmap threshold (malloc.h)."""
_LARGE_ALLOCATION = 1024 * 1024


def release_large_allocations() -> bool:
    """Give every allocation of 1 MiB or more its own mapping, returned to the system when
    freed; False where the C library has no such setting (not glibc).

    glibc raises its mmap threshold to the size of any mapped block that is freed (up to
    32 MiB), so after the first large request body every later one comes from the heap of
    the thread that joined it and stays resident once freed: 4 clients uploading 31 MiB
    bodies left the router 238 MiB larger after they had gone (`bench/hostile/`, phase
    a). Setting the threshold turns that adjustment off. Reads and ordinary requests are
    far smaller, so the data plane's allocations are unchanged.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _LARGE_ALLOCATION))


class LocalResources:
    """The router's own resources running out: rate-limited logs, counts, health reasons."""

    def __init__(
        self,
        count: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`count(resource)` counts one event (and is expected to call `seen`, as the metrics
        do once watched); None: events are only seen here."""
        self._count = count
        self._clock = clock
        self._last: dict[str, float] = {}
        self._logs = LogLimit(_log, _WINDOW, clock)

    def exhausted(self, name: str, detail: str) -> None:
        """One event of resource `name` running out on the client side; `detail` says what."""
        self._logs.log(name, logging.WARNING, "local resource exhausted (%s): %s", name, detail)
        if self._count is not None:
            self._count(name)
        else:
            self.seen(name)

    def record_error(self, error: OSError, what: str) -> bool:
        """Report `error` if it says a local resource ran out; False if it is another error."""
        name = local_resource(error)
        if name is None:
            return False
        self.exhausted(name, f"{what}: {error.strerror or error}")
        return True

    def seen(self, name: str) -> None:
        """Resource `name` ran out just now (counted already, wherever that happened)."""
        self._last[name] = self._clock()

    def problems(self) -> list[str]:
        """Why `/health` is degraded: each resource that ran out within the last minute."""
        now = self._clock()
        return [
            f"router out of {_NAMES.get(name, name)} {now - at:.0f}s ago"
            for name, at in sorted(self._last.items())
            if now - at < _WINDOW
        ]
