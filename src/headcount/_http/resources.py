"""The router's own resources: the open-file limit raised at start, and running out told apart.

Running out of file descriptors (EMFILE, ENFILE), socket buffers (ENOBUFS) or
memory (ENOMEM), or reaching `--max-connections`, is the router's condition, not
an engine's: it is counted here by resource (the metric
`headcount_local_resource_errors_total{resource}`), logged at most once a minute
per resource, and, for a minute after the last time, named by `problems()` so
that `/health` says `degraded` and why. Nothing here touches an engine's state.
"""

from __future__ import annotations

import errno
import logging
import resource
import time
from collections.abc import Callable, Mapping

__all__ = ["RESOURCE_ERRNOS", "LocalResources", "raise_open_file_limit"]

_log = logging.getLogger(__name__)

RESOURCE_ERRNOS: Mapping[int, str] = {
    errno.EMFILE: "fds",
    errno.ENFILE: "fds",
    errno.ENOBUFS: "buffers",
    errno.ENOMEM: "memory",
}
"""OS errors that say the router itself ran out of something, by resource label."""

_RESOURCES = ("fds", "connections", "buffers", "memory")
_WINDOW = 60.0
"""How long one exhaustion stays in `/health`, and the least time between two log lines."""


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


class LocalResources:
    """Exhaustion of the router's own resources: counts, rate-limited logs, health reasons."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.counts: dict[str, int] = dict.fromkeys(_RESOURCES, 0)
        """Events by resource since start (the metric)."""
        self._last: dict[str, tuple[float, str]] = {}
        self._logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def exhausted(self, name: str, detail: str) -> None:
        """One event of resource `name` running out; `detail` says what failed."""
        now = self._clock()
        self.counts[name] = self.counts.get(name, 0) + 1
        self._last[name] = (now, detail)
        logged = self._logged.get(name)
        if logged is not None and now - logged < _WINDOW:
            self._unlogged[name] = self._unlogged.get(name, 0) + 1
            return
        self._logged[name] = now
        more = self._unlogged.pop(name, 0)
        _log.warning(
            "local resource exhausted (%s): %s; %d more since the last report",
            name,
            detail,
            more,
        )

    def record_error(self, error: OSError, what: str) -> bool:
        """Count `error` if it says a local resource ran out; False if it is another error."""
        name = RESOURCE_ERRNOS.get(error.errno or 0)
        if name is None:
            return False
        self.exhausted(name, f"{what}: {error.strerror or error}")
        return True

    def problems(self) -> list[str]:
        """Why `/health` is degraded: each resource that ran out within the last minute."""
        now = self._clock()
        return [
            f"router out of {name} {now - at:.0f}s ago ({detail})"
            for name, (at, detail) in sorted(self._last.items())
            if now - at < _WINDOW
        ]
