"""What headcount says about the streams: its JSON log read back, and its metrics.

The log (`--log-format json`, one document a line) gives, per `x-request-id`:
the access-log line (logger `headcount.access`: `outcome`, `engine`,
`resumed_from`), and the lines the proxy writes the moment it resumes a stream
("stream ID for model M resumed on engine E after ...") or cuts one ("stream ID
for model M cut, not resumed (REASON): ..."). Times are the log's (UTC wall
clock, to the millisecond). The metrics give the resume counter by outcome and
the seam histogram. Pure functions of text: the unit tests feed them lines.
"""

from __future__ import annotations

import datetime
import json
import re
from collections import Counter
from dataclasses import dataclass, field

__all__ = [
    "RESUMES",
    "SEAM",
    "AccessLine",
    "Histogram",
    "RouterEvent",
    "RouterLog",
    "histogram",
    "parse_log",
    "resume_counts",
    "samples",
]

RESUMES = "headcount_stream_resumes_total"
SEAM = "headcount_stream_resume_gap_seconds"
_ACCESS_LOGGER = "headcount.access"
_RESUMED = re.compile(r"^stream (\S+) for model .* resumed on engine (\S+) after ")
_CUT = re.compile(r"^stream (\S+) for model .* cut, not resumed \(([^)]*)\): ")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class AccessLine:
    at: float
    """When it was written (the request's end), seconds since the epoch."""
    request_id: str
    outcome: str
    engine: str | None
    resumed_from: tuple[str, ...]

    @property
    def engines(self) -> frozenset[str]:
        """Every engine the request was on: those it broke on and the last."""
        return frozenset(self.resumed_from) | ({self.engine} if self.engine else frozenset())


@dataclass(frozen=True)
class RouterEvent:
    """A line about one stream's failure: `kind` `resumed` (`detail`: the engine it went on
    on), `cut` (`detail`: the refusal's reason) or `access-cut` (its access line, outcome cut)."""

    at: float
    request_id: str
    kind: str
    detail: str


@dataclass
class RouterLog:
    access: dict[str, AccessLine] = field(default_factory=dict)
    """By request id."""
    events: list[RouterEvent] = field(default_factory=list)
    cut_reasons: dict[str, str] = field(default_factory=dict)
    """Why each stream the router cut was not resumed, by request id."""


def _epoch(stamp: str) -> float:
    """`2026-12-02T03:56:41.123Z` as seconds since the epoch."""
    parsed = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
    return parsed.replace(tzinfo=datetime.UTC).timestamp()


def parse_log(text: str) -> RouterLog:
    """The access lines and the resume and cut lines of a JSON log; other lines are skipped."""
    log = RouterLog()
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
            at = _epoch(doc["time"])
        except (ValueError, KeyError, TypeError):
            continue
        message = str(doc.get("message", ""))
        if doc.get("logger") == _ACCESS_LOGGER and isinstance(doc.get("request_id"), str):
            entry = AccessLine(
                at,
                doc["request_id"],
                str(doc.get("outcome")),
                doc.get("engine") if isinstance(doc.get("engine"), str) else None,
                tuple(filter(None, str(doc.get("resumed_from") or "").split(","))),
            )
            log.access[entry.request_id] = entry
            if entry.outcome == "cut":
                log.events.append(RouterEvent(at, entry.request_id, "access-cut", ""))
        elif found := _RESUMED.match(message):
            log.events.append(RouterEvent(at, found[1], "resumed", found[2]))
        elif found := _CUT.match(message):
            log.events.append(RouterEvent(at, found[1], "cut", found[2]))
            log.cut_reasons[found[1]] = found[2]
    return log


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric `name` in a Prometheus text exposition, with their labels."""
    found = []
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        head, _, value = line.rpartition(" ")
        labels = dict(_LABEL.findall(head[len(name) :]))
        found.append((labels, float(value)))
    return found


def resume_counts(text: str) -> Counter[str]:
    """`headcount_stream_resumes_total` by outcome, summed over models."""
    counts: Counter[str] = Counter()
    for labels, value in samples(text, RESUMES):
        counts[labels.get("outcome", "?")] += int(value)
    return counts


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]
    """(upper bound, cumulative count), ascending; the last is +Inf."""
    count: float
    total: float

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the `q` quantile (0..1): the histogram says no
        more; None when empty (inf when past the last finite bound)."""
        if self.count <= 0:
            return None
        for bound, cumulative in self.buckets:
            if cumulative >= q * self.count:
                return bound
        return float("inf")

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None


def histogram(text: str, name: str) -> Histogram:
    """Histogram `name` from a Prometheus text exposition, summed over its label sets."""
    bounds: dict[float, float] = {}
    for labels, value in samples(text, name + "_bucket"):
        bound = float(labels.get("le", "inf"))
        bounds[bound] = bounds.get(bound, 0.0) + value
    count = sum(value for _, value in samples(text, name + "_count"))
    total = sum(value for _, value in samples(text, name + "_sum"))
    return Histogram(tuple(sorted(bounds.items())), count, total)
