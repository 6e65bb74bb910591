"""Passive outlier detection, as Envoy does it: the decisions, pure, over counts and time.

An engine whose probes pass can still fail every request (a broken model, a
full disk, a wedged GPU). The proxy counts each engine's consecutive errors,
and any answer under 500 resets the count. What counts:

- a gateway error (connect failure, timeout, protocol violation, broken
  stream) or a 502/503 answer: the engine could not take the request, whatever
  the request was;
- another 5xx answer (500, 504, ...) only once the request has shown it is not
  its own fault. vLLM answers 500 for some inputs it cannot handle, so a
  client could otherwise eject any healthy engine with five bad requests
  pinned to it (`x-session-id`). Such an answer is relayed to no one yet: the
  request is tried once more on another engine. If that one answers under 500,
  the first engine's 5xx counts against it (and the client gets the good
  answer); if it answers a 5xx too, the request is at fault and neither engine
  is counted. With no other engine to try (or none that answers) the 5xx counts
  once, at the request's end: evidence that cannot be checked is taken as it
  stands, as Envoy takes every 5xx.

A request counts at most once against each engine it tried, however it was
retried. A stalled engine (requests waited `--stalled-engine-timeout` for a
first byte and it sent none to anyone: `proxy/stalls.py`) is ejected at once,
reason `stalled`: that is no single request's doing.

At `OutlierSettings.consecutive_errors` the engine is ejected: out of
rotation for `base_ejection` times the number of its ejections, at most
`max_ejection`. The multiplier decays by one for every `base_ejection` the
engine then spends in rotation, so an engine that failed once, long ago,
starts over. The ejection ends when its time is up, or earlier when a
probe succeeds after a failed one (the engine went down and came back); a
probe that kept passing proves nothing about what the ejection is for.

The panic threshold: when more than `max_ejected_percent` of a model's engines
are ejected, that model is routed to all of them as if none were, since the
likelier fault is then the traffic or the router's view, and refusing
everything would turn a partial failure into a total one.

Everything here is a function of its arguments; the fleet keeps the records
and applies them, the proxy counts, metrics and logs tell. The numbers and
the reasons for them are in `config.OutlierSettings`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from headcount.config import OutlierSettings

__all__ = [
    "GATEWAY_ERROR",
    "HTTP_5XX",
    "NOT_EJECTED",
    "REASONS",
    "STALLED",
    "Ejection",
    "next_ejection",
    "panicking",
    "route_around",
]

T = TypeVar("T")

HTTP_5XX = "http_5xx"
"""The error that tipped the count was a 5xx answer."""
GATEWAY_ERROR = "gateway_error"
"""... a connect failure, a timeout, a protocol violation or a broken stream."""
STALLED = "stalled"
"""The engine sent no first byte to any request while one waited a whole
`--stalled-engine-timeout` (`proxy/stalls.py`): decisive alone, no count to reach."""
REASONS = (HTTP_5XX, GATEWAY_ERROR, STALLED)
"""Every `reason` label of `headcount_outlier_ejections_total`."""


@dataclass(frozen=True, slots=True)
class Ejection:
    """An engine's outlier record: out of rotation while `now < until`."""

    count: int = 0
    """Ejections so far, decayed by time spent in rotation: the duration multiplier."""
    until: float = -math.inf
    """When the current (or last) ejection ends."""
    reason: str | None = None

    def active(self, now: float) -> bool:
        return now < self.until


NOT_EJECTED = Ejection()


def next_ejection(
    previous: Ejection, now: float, reason: str, settings: OutlierSettings
) -> Ejection:
    """The ejection that starts at `now`: `base x multiplier`, capped at `max_ejection`.

    The multiplier is the previous one, less one per `base_ejection` spent in rotation
    since the last ejection ended, plus one.
    """
    count = previous.count
    if count and now > previous.until:
        count = max(0, count - int((now - previous.until) // settings.base_ejection))
    count += 1
    duration = min(settings.base_ejection * count, settings.max_ejection)
    return Ejection(count, now + duration, reason)


def panicking(ejected: int, total: int, max_ejected_percent: float) -> bool:
    """Whether `ejected` of a model's `total` engines is over the share that may be ejected."""
    return ejected > 0 and ejected * 100 > max_ejected_percent * total


def route_around(
    groups: Mapping[str, Sequence[T]], ejected: Callable[[T], bool], max_ejected_percent: float
) -> tuple[dict[str, tuple[T, ...]], frozenset[str]]:
    """Each model's engines with the ejected left out, unless too many are (the model panics
    and keeps them all); and the panicking models. Models left with no engine are dropped."""
    routed: dict[str, tuple[T, ...]] = {}
    panic: set[str] = set()
    for model, group in groups.items():
        kept = tuple(item for item in group if not ejected(item))
        if panicking(len(group) - len(kept), len(group), max_ejected_percent):
            panic.add(model)
            kept = tuple(group)
        if kept:
            routed[model] = kept
    return routed, frozenset(panic)
