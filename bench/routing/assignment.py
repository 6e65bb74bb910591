"""The best fixed assignment of tenants to engines in hindsight, a bound on placement.

Each tenant (its system prompt and its chats, the workload's prefix groups)
gets one home engine, or two: a tenant copied on two engines sends its
conversations to them alternately (its k-th conversation, by first arrival,
to home k mod 2; a chat's turns stay with its first question's home). The
assignment is fixed for the whole run, chosen knowing the whole trace, and is
feasible when every engine's share of the measured requests is within
`tolerance` (10 %) of the mean. Its hit rate is the cache model's
(`cache_model.lru_hits`, per engine, warm-up included, hits counted over the
measured requests), so it is comparable with the model's replay of each
router's own trace.

Found by local search, seeded: a greedy start (tenants by falling request
count, each to the least loaded engine, copied when one engine cannot carry
it within the bound; later restarts shuffle that order), then `steps` random
moves, each kept when it lowers the load violation, or keeps it and raises
the hits: move one home of a tenant to another engine, swap homes of two
tenants, copy a tenant onto a second engine or drop a copy. Per engine, the
hits of a set of tenant parts are computed once and remembered.

Not done: an integer program (HiGHS through SciPy). The hits of an engine are
not a sum over the tenants placed on it: under LRU they depend on the
interleaving of everything placed there, so an IP would have to replace the
cache model with a static one (a tenant is cached or not, by size and
rate), which is the approximation this bound is here to check.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.routing.cache_model import Access, lru_hits

__all__ = ["Placement", "best_fixed_assignment"]

_Part = tuple[int, int, int]
"""(tenant, its number of homes, which of them): a set of its requests."""


@dataclass(frozen=True)
class Placement:
    homes: tuple[tuple[int, ...], ...]
    """Per tenant, its engines."""
    hit_blocks: int
    """Over the measured requests."""
    loads: tuple[int, ...]
    """Measured requests per engine."""
    violation: float
    """Requests beyond the load bound, summed over engines (0: feasible)."""


@dataclass
class _Problem:
    accesses: Sequence[Access]
    measured: Sequence[bool]
    parts: dict[_Part, list[int]]
    engines: int
    capacity: int
    low: float
    high: float
    memo: dict[frozenset[_Part], tuple[int, int]]

    def engine_value(self, parts: frozenset[_Part]) -> tuple[int, int]:
        """(hit blocks, load) of an engine holding `parts`."""
        known = self.memo.get(parts)
        if known is None:
            indices = sorted(i for part in parts for i in self.parts.get(part, ()))
            hits = lru_hits([self.accesses[i] for i in indices], self.capacity)
            measured = [self.measured[i] for i in indices]
            value = sum(h for h, m in zip(hits, measured, strict=True) if m), sum(measured)
            known = self.memo[parts] = value
        return known

    def place(self, homes: Sequence[tuple[int, ...]]) -> Placement:
        held: list[set[_Part]] = [set() for _ in range(self.engines)]
        for tenant, own in enumerate(homes):
            for which, engine in enumerate(own):
                held[engine].add((tenant, len(own), which))
        values = [self.engine_value(frozenset(parts)) for parts in held]
        loads = tuple(load for _, load in values)
        violation = sum(max(0.0, load - self.high, self.low - load) for load in loads)
        return Placement(tuple(homes), sum(h for h, _ in values), loads, violation)


def _better(a: Placement, b: Placement) -> bool:
    return (a.violation, -a.hit_blocks) < (b.violation, -b.hit_blocks)


def best_fixed_assignment(
    accesses: Sequence[Access],
    measured: Sequence[bool],
    tenants: Sequence[int],
    conversations: Sequence[int],
    engines: int,
    capacity: int,
    *,
    tolerance: float = 0.10,
    restarts: int = 4,
    steps: int = 1500,
    seed: int = 0,
) -> Placement:
    """The best assignment found; requests i are of tenant `tenants[i]`, chat `conversations[i]`."""
    ordinal: dict[int, int] = {}
    opened: dict[int, int] = {}
    parts: dict[_Part, list[int]] = {}
    count = max(tenants, default=-1) + 1
    for index, (tenant, chat) in enumerate(zip(tenants, conversations, strict=True)):
        if chat not in ordinal:
            ordinal[chat] = opened.get(tenant, 0)
            opened[tenant] = ordinal[chat] + 1
        parts.setdefault((tenant, 1, 0), []).append(index)
        parts.setdefault((tenant, 2, ordinal[chat] % 2), []).append(index)
    mean = sum(measured) / engines
    problem = _Problem(
        accesses,
        measured,
        parts,
        engines,
        capacity,
        mean * (1 - tolerance),
        mean * (1 + tolerance),
        {},
    )
    demand = [sum(measured[i] for i in parts.get((t, 1, 0), [])) for t in range(count)]
    size = [
        max((len(accesses[i].blocks) for i in parts.get((t, 1, 0), [])), default=0)
        for t in range(count)
    ]
    hottest = sorted(range(count), key=lambda t: -demand[t])
    rng = random.Random(seed)
    best: Placement | None = None
    for restart in range(restarts):
        if restart % 2 == 0:
            order = list(hottest)
            if restart:
                rng.shuffle(order)
            start = _greedy(order, demand, engines, problem.high)
        else:
            start = _spill(hottest, demand, size, engines, capacity, problem.high)
        found = _search(problem, start, demand, rng, steps)
        if best is None or _better(found, best):
            best = found
    assert best is not None
    return best


def _greedy(
    order: Sequence[int], demand: Sequence[int], engines: int, high: float
) -> list[tuple[int, ...]]:
    loads = [0.0] * engines
    homes: list[tuple[int, ...]] = [()] * len(demand)
    for tenant in order:
        by_load = sorted(range(engines), key=lambda e: loads[e])
        copies = 2 if loads[by_load[0]] + demand[tenant] > high and engines > 1 else 1
        homes[tenant] = tuple(by_load[:copies])
        for engine in homes[tenant]:
            loads[engine] += demand[tenant] / copies
    return homes


def _spill(
    hottest: Sequence[int],
    demand: Sequence[int],
    size: Sequence[int],
    engines: int,
    capacity: int,
    high: float,
) -> list[tuple[int, ...]]:
    """The hottest tenants packed onto all engines but the last while they fit its cache
    and load bound, copied when too busy for one; the rest spill onto the last."""
    loads = [0.0] * engines
    held = [0] * engines
    homes: list[tuple[int, ...]] = [(engines - 1,)] * len(demand)
    for tenant in hottest:
        fits = [
            e for e in range(engines - 1) if held[e] + size[tenant] <= capacity and loads[e] < high
        ]
        if not fits:
            continue
        fits.sort(key=lambda e: loads[e])
        copies = 2 if demand[tenant] > high and len(fits) > 1 else 1
        homes[tenant] = tuple(fits[:copies])
        for engine in homes[tenant]:
            loads[engine] += demand[tenant] / copies
            held[engine] += size[tenant]
    return homes


def _search(
    problem: _Problem,
    homes: list[tuple[int, ...]],
    demand: Sequence[int],
    rng: random.Random,
    steps: int,
) -> Placement:
    current = problem.place(homes)
    count, engines = len(homes), problem.engines
    population = range(count)
    weights = [d + 1 for d in demand]
    for _ in range(steps):
        trial = list(current.homes)
        tenant = rng.choices(population, weights)[0] if rng.random() < 0.5 else rng.randrange(count)
        own = trial[tenant]
        move = rng.randrange(3)
        others = [e for e in range(engines) if e not in own]
        if move == 0 and others:
            which = rng.randrange(len(own))
            trial[tenant] = (*own[:which], rng.choice(others), *own[which + 1 :])
        elif move == 1:
            other = rng.randrange(count)
            theirs = trial[other]
            a, b = rng.randrange(len(own)), rng.randrange(len(theirs))
            if own[a] in theirs or theirs[b] in own:
                continue
            trial[tenant] = (*own[:a], theirs[b], *own[a + 1 :])
            trial[other] = (*theirs[:b], own[a], *theirs[b + 1 :])
        elif len(own) == 2:
            trial[tenant] = (own[rng.randrange(2)],)
        elif others:
            trial[tenant] = (*own, rng.choice(others))
        else:
            continue
        candidate = problem.place(trial)
        if not _better(current, candidate):
            current = candidate
    return current
