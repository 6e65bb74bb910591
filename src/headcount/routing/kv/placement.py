"""Where the fleet's cache should hold which prefix: a plan, a pure function of a snapshot.

Greedy per-request routing spreads a fleet under cache pressure into an LRU
cache per engine fed by every prefix: cold prompts evict warm ones
everywhere. A plan instead gives each hot prefix group its home engines and
sends the rest (the tail, and prefixes never seen) to a few spill engines,
where they evict each other rather than the hot sets.

`plan_placement` packs the groups, hottest first (value per block of cache
is the group's request rate: each request on its home saves its `blocks`),
onto engines within

- capacity: the blocks homed on an engine stay within `fill` of its usable
  cache (its GPU blocks less what requests in flight hold);
- load: each copy's share of the group's requests keeps the engine within
  `(1 + load_slack)` x the mean request rate; a group gets more than one
  home only when one engine cannot carry it within that bound, or when its
  requests overflowed its homes since the last plan;
- churn: on a spill engine, a group's copy is only homed when the tail's
  misses between two of its requests (in blocks) leave it in the LRU.

The spill engines are as few as carry the tail's prefill work within
`(1 + work_slack)` x the mean engine's work (a request's work: its uncached
blocks plus `request_blocks`), one at least; more when the tail overflowed
the spill set since the last plan. They are the engines with the least hot
load in a first packing over all engines.

Hysteresis (moving a prefix costs a full prefill on its new home): a group
homed before ranks as if its rate were `1 + margin` times higher, and keeps
its homes, and the spill set its engines, as long as they still fit.

Deterministic: groups are ordered by rate then key, engines by id, and
every bound is a share of the total (the load bound, the work bound, the
tail's cut at `min_share`; only `min_requests`, a noise floor, counts
requests), so replicas that see the same events and the same traffic shares
reach the same plan, whatever their share of the whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from headcount.kvindex.keys import BlockKey

__all__ = ["EngineRoom", "PlacementSettings", "Plan", "PrefixGroup", "plan_placement"]


@dataclass(frozen=True, slots=True)
class PrefixGroup:
    """One prefix group as the router's traffic shows it."""

    key: BlockKey
    blocks: int
    """The head its requests share, in blocks."""
    rate: float
    """Its requests, decayed counts (any unit: only ratios matter)."""
    prompt_blocks: float
    """The mean prompt of its requests, in blocks."""
    overflow: float = 0.0
    """Of `rate`, the requests that left their homes (same unit)."""


@dataclass(frozen=True, slots=True)
class EngineRoom:
    """One engine as the plan sees it."""

    id: str
    blocks: int
    """Its usable cache: GPU blocks less what requests in flight hold."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Each hot group's homes, by group key, and the spill engines for everything else."""

    homes: Mapping[BlockKey, tuple[str, ...]]
    spill: tuple[str, ...]
    engines: tuple[str, ...]
    """The engines planned over, by id."""


@dataclass(frozen=True, slots=True)
class PlacementSettings:
    """What the planner and the per-request choice weigh; `--kv-placement on` uses these."""

    interval: float = 2.0
    """Seconds between two plans."""
    max_age: float = 6.0
    """A plan older than this is not used (greedy routing)."""
    half_life: float = 20.0
    """Of a group's request counts, in seconds."""
    fill: float = 0.8
    """Of an engine's usable cache, what hot groups may take: the rest holds the running
    requests' own blocks and the LRU's slack."""
    load_slack: float = 0.1
    work_slack: float = 0.5
    request_blocks: float = 16.0
    """A request's work besides its uncached blocks (scheduling, decode), in blocks."""
    margin: float = 0.2
    min_requests: float = 1.5
    """A group with fewer decayed requests is tail: the noise floor, the one absolute count."""
    min_share: float = 0.005
    """A group with a smaller share of the requests is tail."""
    overflow_share: float = 0.1
    """Overflow past this share of a group's (or the tail's) requests adds a copy (a spill
    engine)."""
    leave_penalty: float = 1.0
    """A request leaves its homes when the least queued of them has more queued than the
    least queued engine by more than this many of its prompts."""


@dataclass(slots=True)
class _Packing:
    homes: dict[BlockKey, tuple[str, ...]]
    load: dict[str, float]
    """Homed requests per engine."""
    tail_rate: float
    tail_work: float
    home_work: float
    tail_blocks: float
    """The tail's mean prompt, in blocks."""


def plan_placement(
    groups: Sequence[PrefixGroup],
    engines: Sequence[EngineRoom],
    previous: Plan | None,
    settings: PlacementSettings,
    *,
    spill_overflow: float = 0.0,
) -> Plan:
    """The plan for `groups` on `engines`; `previous` for hysteresis, `spill_overflow`: the
    tail's requests that left the spill engines since it was made."""
    rooms = sorted(engines, key=lambda e: e.id)
    ids = tuple(e.id for e in rooms)
    total = sum(g.rate for g in groups)
    if len(rooms) < 2 or total <= 0:
        return Plan({}, ids[:1], ids)
    before = previous if previous is not None and previous.engines == ids else None
    ranked = sorted(groups, key=lambda g: (-_rank(g, before, settings), g.key))
    bound = (1 + settings.load_slack) * total / len(rooms)
    rate_room = dict.fromkeys(ids, bound)
    floor = max(settings.min_requests, settings.min_share * total)
    first = _pack(ranked, rooms, rate_room, {}, before, settings, bound, floor)
    work = first.tail_work + first.home_work
    per_engine = (1 + settings.work_slack) * work / len(rooms)
    count = max(1, math.ceil(first.tail_work / per_engine)) if per_engine > 0 else 1
    had = 0 if before is None else len(before.spill)
    count = min(_grown(count, had, spill_overflow, first.tail_rate, settings), len(rooms))
    spill = _spill_engines(ids, count, first.load, before)
    tail_share = first.tail_rate / count
    churn = {e: tail_share * first.tail_blocks for e in spill}
    for engine in spill:
        rate_room[engine] = bound - tail_share
    second = _pack(ranked, rooms, rate_room, churn, before, settings, bound, floor)
    return Plan(second.homes, spill, ids)


def _rank(group: PrefixGroup, before: Plan | None, settings: PlacementSettings) -> float:
    homed = before is not None and group.key in before.homes
    return group.rate * (1 + settings.margin) if homed else group.rate


def _copies(
    group: PrefixGroup, before: Plan | None, bound: float, settings: PlacementSettings
) -> int:
    copies = max(1, math.ceil(group.rate / bound))
    had = 0 if before is None else len(before.homes.get(group.key, ()))
    return _grown(copies, had, group.overflow, group.rate, settings)


def _grown(wanted: int, had: int, overflow: float, rate: float, settings: PlacementSettings) -> int:
    """`wanted` engines, or one more than `had` while over a tenth of `rate` overflowed them,
    or `had` while some still does (a fifth of that share): no flapping back at once."""
    if overflow > settings.overflow_share * rate:
        return max(wanted, had + 1)
    if overflow > settings.overflow_share * rate / 5:
        return max(wanted, had)
    return wanted


def _pack(
    ranked: Sequence[PrefixGroup],
    rooms: Sequence[EngineRoom],
    rate_room: Mapping[str, float],
    churn: Mapping[str, float],
    before: Plan | None,
    settings: PlacementSettings,
    bound: float,
    floor: float,
) -> _Packing:
    capacity = {e.id: e.blocks * settings.fill for e in rooms}
    used = dict.fromkeys(capacity, 0.0)
    load = dict.fromkeys(capacity, 0.0)
    packing = _Packing({}, load, 0.0, 0.0, 0.0, 0.0)
    for group in ranked:
        chosen: list[str] = []
        if group.rate >= floor:
            copies = min(_copies(group, before, bound, settings), len(rooms))
            share = group.rate / copies
            kept = () if before is None else before.homes.get(group.key, ())
            others = sorted(
                (e for e in capacity if e not in kept), key=lambda e: (load[e] - rate_room[e], e)
            )
            for engine in (*kept, *others):
                if len(chosen) == copies:
                    break
                blocks = used[engine] + group.blocks
                if blocks > capacity[engine] or load[engine] + share > rate_room[engine]:
                    continue
                if churn.get(engine, 0.0) / share + blocks > capacity[engine]:
                    continue
                chosen.append(engine)
        if not chosen:
            packing.tail_rate += group.rate
            packing.tail_work += group.rate * (group.prompt_blocks + settings.request_blocks)
            packing.tail_blocks += group.rate * group.prompt_blocks
            continue
        for engine in chosen:
            used[engine] += group.blocks
            load[engine] += group.rate / len(chosen)
        unique = max(0.0, group.prompt_blocks - group.blocks)
        packing.home_work += group.rate * (unique + settings.request_blocks)
        packing.homes[group.key] = tuple(sorted(chosen))
    if packing.tail_rate > 0:
        packing.tail_blocks /= packing.tail_rate
    return packing


def _spill_engines(
    ids: Sequence[str], count: int, load: Mapping[str, float], before: Plan | None
) -> tuple[str, ...]:
    """`count` engines: the previous spill engines first, then those with the least hot load."""
    kept = [] if before is None else [e for e in before.spill if e in load]
    rest = sorted((e for e in ids if e not in kept), key=lambda e: (load[e], e))
    return tuple(sorted((*kept, *rest)[:count]))
