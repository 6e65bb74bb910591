"""Health that tells the truth: liveness, readiness and status from discovery's freshness.

Everything here is a pure function of the sources' `SourceStatus`, the fleet
snapshot, the settings and the time. Liveness fails only when a discovery loop
is wedged or dead (a restart fixes that; it does not fix an unreachable API
server, so API errors alone never fail it). Readiness fails before the first
sync and during shutdown, and optionally without routable engines or fresh
discovery. `/health` says ok, degraded (stale) or unavailable, never ok from
the router's own state alone; the router's own resources running out (file
descriptors, the connection limit) make it degraded. With `--routing kv-aware`,
a routable engine whose cache index is stale or off makes it degraded too
(never unavailable: routing falls back to load for that engine).

Without a routable engine, the reason says why, source by source
(`explain_no_engine`): what it watches, how many objects match, and what the
matched ones are instead (not engines, by reason; engines, by state), so a
wrong namespace, a selector typo and pods that are not ready read apart.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headcount.config import HealthSettings
from headcount.discovery.source import SourceStatus, Watched
from headcount.fleet import Engine, Snapshot
from headcount.kvindex.trust import IndexTrust
from headcount.surfaces.kv_views import IndexStatus

if TYPE_CHECKING:
    from headcount.routing.kv.planning import PlacementStatus

__all__ = [
    "KV_INDEX_CHECK",
    "KV_PLACEMENT",
    "Check",
    "HealthReport",
    "Status",
    "evaluate",
    "explain_no_engine",
    "kv_index_check",
    "render_checks",
]

KV_INDEX_CHECK = "kv_index"
KV_PLACEMENT = "kv_placement"
_NAMED = 5
"""Engines named in the kv_index reason; the rest are counted."""
_REASON_CHARS = 80
"""Of each engine's own reason, in the kv_index reason."""
_NO_ENGINE = "no routable engine: "


class Status(enum.StrEnum):
    OK = "ok"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class HealthReport:
    status: Status
    live: tuple[Check, ...]
    ready: tuple[Check, ...]
    body: Mapping[str, Any]
    """The `/health` JSON document."""
    no_engine: str = ""
    """Why no engine is routable (`first sync not done: API server unreachable`), or `""`."""

    @property
    def is_live(self) -> bool:
        return all(check.ok for check in self.live)

    @property
    def is_ready(self) -> bool:
        return all(check.ok for check in self.ready)


def evaluate(
    sources: Sequence[SourceStatus],
    snapshot: Snapshot,
    settings: HealthSettings,
    *,
    now: float,
    started: float,
    dead_sources: Collection[str] = (),
    shutting_down: bool = False,
    local_problems: Sequence[str] = (),
    kv_indexes: Mapping[str, IndexStatus] | None = None,
    kv_placement: PlacementStatus | None = None,
) -> HealthReport:
    """Judge the router's health at `now` (same clock as the statuses; `started` = boot).

    `local_problems`: the router's own resources that ran out lately (file descriptors,
    the connection limit): degraded, never an engine's fault. `kv_indexes`: the engines'
    cache indexes by engine id with `--routing kv-aware`, else None; `kv_placement`: the
    state of its placement plan (shown, never degrading: without a plan routing is greedy).
    """
    kv_check = None if kv_indexes is None else kv_index_check(snapshot, kv_indexes)
    live = tuple(_liveness(source, settings, now, started, dead_sources) for source in sources)
    routable = len(snapshot.routable)
    stale = [
        s.name
        for s in sources
        if s.can_go_stale and _age(s.last_success, now) > settings.discovery_stale_after
    ]
    unsynced = [_unsynced(s) for s in sources if not s.synced]
    troubles = [
        _trouble(s, len(sources) > 1) for s in sources if s.synced and s.failing_since is not None
    ]
    why_none = "" if routable else _why_no_engine(sources, snapshot)
    no_engine = "" if routable else _NO_ENGINE + why_none

    ready = [
        Check(
            "synced",
            not unsynced,
            f"first sync not done: {', '.join(unsynced)}" if unsynced else "",
        ),
        Check("shutdown", not shutting_down, "shutting down" if shutting_down else ""),
    ]
    if settings.ready_requires_engines:
        ready.append(Check("engines", routable > 0, no_engine))
    if settings.ready_requires_fresh:
        reason = f"discovery stale: {', '.join(stale)}" if stale else ""
        ready.append(Check("fresh", not stale, reason))

    if unsynced or not all(check.ok for check in live) or routable == 0 or shutting_down:
        status = Status.UNAVAILABLE
    elif stale or local_problems or (kv_check is not None and not kv_check.ok):
        status = Status.DEGRADED
    else:
        status = Status.OK

    counts = snapshot.count_by_state()
    body: dict[str, Any] = {
        "status": status.value,
        # dict.fromkeys: the optional readiness checks repeat the stale and no-engine reasons.
        "reasons": list(
            dict.fromkeys(
                [c.reason for c in (*live, *ready) if not c.ok]
                + troubles
                + ([f"discovery stale: {', '.join(stale)}"] if stale else [])
                + ([no_engine] if no_engine else [])
                + list(local_problems)
                + ([kv_check.reason] if kv_check is not None and not kv_check.ok else [])
            )
        ),
        "engines": {"routable": routable, **{state.value: n for state, n in counts.items()}},
        "sources": [_describe_source(s, snapshot, now) for s in sources],
    }
    if kv_check is not None:
        body[KV_INDEX_CHECK] = {"ok": kv_check.ok, "reason": kv_check.reason}
    if kv_placement is not None:
        body[KV_PLACEMENT] = _describe_placement(kv_placement, snapshot)
    return HealthReport(status, live, tuple(ready), body, why_none)


def _describe_placement(status: PlacementStatus, snapshot: Snapshot) -> dict[str, Any]:
    named = snapshot.by_id
    return {
        "used": status.used,
        "reason": status.reason,
        "age_s": None if status.age is None else round(status.age, 1),
        "homed_prefixes": status.homed,
        "spill": [named[e].spec.name if e in named else e for e in status.spill],
    }


def explain_no_engine(sources: Sequence[SourceStatus], snapshot: Snapshot) -> str:
    """`no routable engine: ...` and why, from what each source watches and matched."""
    return _NO_ENGINE + _why_no_engine(sources, snapshot)


def _why_no_engine(sources: Sequence[SourceStatus], snapshot: Snapshot) -> str:
    reasons = []
    for source in sources:
        engines = [engine for engine in snapshot.engines if engine.spec.source == source.name]
        reason = _explain_source(source, engines)
        reasons.append(reason if len(sources) == 1 else f"{source.name}: {reason}")
    return "; ".join(reasons) or "no discovery source"


def _failure(source: SourceStatus) -> str:
    """What the source's failing attempts found, in a few words (`""` when not failing)."""
    if source.failing_since is None:
        return ""
    return "API server unreachable" if source.api_unreachable else source.last_error or "failing"


def _unsynced(source: SourceStatus) -> str:
    """`k8s-pods`, or `k8s-pods (API server unreachable)` while its attempts fail."""
    failure = _failure(source)
    return f"{source.name} ({failure})" if failure else source.name


def _trouble(source: SourceStatus, named: bool) -> str:
    """A synced source that fails now: since when, and that the fleet is the last one seen."""
    failure = _failure(source)
    since = time.strftime("%H:%M:%S UTC", time.gmtime(source.failing_since or 0.0))
    if not source.api_unreachable:
        failure = f"discovery failing ({failure})"
    prefix = f"{source.name}: " if named else ""
    return f"{prefix}{failure} since {since}; routing on the last known fleet"


def _explain_source(source: SourceStatus, engines: Sequence[Engine]) -> str:
    if not source.synced:
        failure = _failure(source)
        return f"first sync not done: {failure}" if failure else "first sync not done"
    if source.missing is not None:
        return source.missing
    noun, where = _watched(source.watches)
    not_engines = source.not_engine_counts()
    matched = len(engines) + sum(not_engines.values())
    if matched == 0:
        return f"no {noun} match{where}"
    head = f"{_plural(matched, noun.removesuffix('s'), noun)} match{'es' if matched == 1 else ''}"
    head += where
    if not engines:
        return f"{head} but none is an engine: {_counted(not_engines)}"
    states = Counter(engine.state.value for engine in engines)
    parts = [f"{_plural(len(engines), 'engine')}, none routable ({_counted(states)})"]
    if not_engines:
        parts.append(
            f"{_plural(sum(not_engines.values()), 'not an engine', 'not engines')} "
            f"({_counted(not_engines)})"
        )
    return f"{head}: {'; '.join(parts)}"


def _watched(watched: Watched | None) -> tuple[str, str]:
    """(the plural noun, ` selector S in namespace N`) of what a source watches."""
    if watched is None:
        return "objects", ""
    where = ""
    if watched.label_selector:
        where += f" selector {watched.label_selector}"
    if watched.namespace is not None:
        where += f" in namespace {watched.namespace}"
    return watched.resource, where


def _counted(counts: Counter[str]) -> str:
    """`2 not ready, 1 pending`: most frequent first, ties by name."""
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items(), key=_by_count))


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def kv_index_check(snapshot: Snapshot, indexes: Mapping[str, IndexStatus]) -> Check:
    """Ok when every routable engine's index is usable (synced or rebuilding); the reason
    names the others with their state and why (the first few, then a count)."""
    unusable: list[str] = []
    for engine in snapshot.routable:
        view = indexes.get(engine.id)
        trust, why = (IndexTrust.OFF, "no index") if view is None else (view.trust, view.reason)
        if not trust.usable:
            unusable.append(f"{engine.spec.name} {trust.value} ({why[:_REASON_CHARS]})")
    if not unusable:
        return Check(KV_INDEX_CHECK, True)
    named = "; ".join(unusable[:_NAMED])
    more = f"; and {len(unusable) - _NAMED} more" if len(unusable) > _NAMED else ""
    return Check(
        KV_INDEX_CHECK,
        False,
        f"kv index not usable, routing by load on {len(unusable)} engine(s): {named}{more}",
    )


def _liveness(
    source: SourceStatus,
    settings: HealthSettings,
    now: float,
    started: float,
    dead_sources: Collection[str],
) -> Check:
    name = f"discovery:{source.name}"
    if source.name in dead_sources:
        return Check(name, False, f"discovery loop {source.name} has stopped")
    if not source.can_go_stale:
        return Check(name, True)
    progress = max(
        t for t in (started, source.last_attempt_finished, source.last_event) if t is not None
    )
    idle = now - progress
    if idle > settings.discovery_dead_after:
        return Check(
            name,
            False,
            f"discovery loop {source.name} made no progress for {idle:.0f}s "
            f"(bound {settings.discovery_dead_after:g}s)",
        )
    return Check(name, True)


def _age(then: float | None, now: float) -> float:
    return float("inf") if then is None else now - then


def _rounded_age(then: float | None, now: float) -> float | None:
    return None if then is None else round(now - then, 3)


def _describe_source(source: SourceStatus, snapshot: Snapshot, now: float) -> dict[str, Any]:
    engines = sum(engine.spec.source == source.name for engine in snapshot.engines)
    not_engines = source.not_engine_counts()
    watched = source.watches
    return {
        "name": source.name,
        "kind": source.kind,
        "watches": None
        if watched is None
        else {
            "resources": [watched.resource, *watched.also],
            "namespace": watched.namespace,
            "label_selector": watched.label_selector,
        },
        "missing": source.missing,
        "objects": engines + sum(not_engines.values()),
        "engines": engines,
        "not_engines": dict(sorted(not_engines.items(), key=_by_count)),
        "synced": source.synced,
        "watch_connected": source.watch_connected,
        "last_list_age_seconds": _rounded_age(source.last_list_success, now),
        "last_event_age_seconds": _rounded_age(source.last_event, now),
        "last_attempt_age_seconds": _rounded_age(source.last_attempt_finished, now),
        "relists": dict(source.relists),
        "removed_by_relist": source.removed_by_relist,
        "resource_version": source.resource_version,
        "last_error": source.last_error,
    }


def render_checks(title: str, checks: Sequence[Check], *, verbose: bool) -> tuple[int, str]:
    """The Kubernetes-style text answer of `/livez` or `/readyz`: status code and body."""
    ok = all(check.ok for check in checks)
    if not verbose and ok:
        return 200, "ok\n"
    lines = [
        f"[+]{check.name} ok" if check.ok else f"[-]{check.name} failed: {check.reason}"
        for check in checks
    ]
    lines.append(f"{title} check passed" if ok else f"{title} check failed")
    return (200 if ok else 503), "\n".join(lines) + "\n"
