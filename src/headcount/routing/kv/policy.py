"""The `kv-aware` routing policy: the engine with the lowest predicted time to first token.

An engine's predicted time to first token, in prompt tokens to prefill before
this request's first token, is

    (prompt - tokens it holds cached)      what it must prefill of this request
  + load.prefill_queued                    uncached prompt tokens we sent it, not yet answered
  + waiting_tokens * max(load.waiting,     requests queued on it: scraped (every router's),
                         load.awaiting)      or ours with no first byte yet, if more
  + prompt * fullness                      KV usage past `full_usage`: it would evict or wait

and an engine is chosen by that plus `(miss_weight - 1) * (prompt - cached)`: a
miss also costs later, since the blocks it caches evict as many others' cached
blocks, which someone will prefill again (under LRU often more than once: the
weight is 4). Without it the choice is greedy for this request's TTFT and
spreads each prompt over the fleet, which then holds fewer distinct prefixes
(bench/RESULTS.md has the hit rates of each weight).

`load.awaiting` is what the router sees between two scrapes: an engine that
stopped answering while its probes pass (and its metrics show nothing queued)
grows it with every request sent there, so its cached prefix stops drawing
them after a few (`proxy/stalls.py` then moves those off it). Our own waiting
requests are in the scraped count too: the larger of the two counts, not both.

The cached part comes from the engine's index (`KvIndexView.match` over the
request's block keys); an engine whose index is not usable (stale, off) counts
nothing cached and is routed on load alone. Affinity yields when an engine
saturates: it queues requests (`waiting`), its KV cache fills, prefill piles up
on it (all in the cost), or it has `saturation_slack` more requests in flight
than (1 + epsilon) x the mean, when it is skipped unless all are, so a hot
tenant cannot pile onto one engine between two scrapes. The slack keeps that
bound from firing at the small in-flight counts where it only moves prompts off
their cache (a bound of (1 + epsilon) x the mean alone cost cache hits).
Ties go to the fewest in flight, then round-robin from a moving start.

With `--kv-placement on` and a fresh plan (`placement.py`, `planning.py`), a
request whose prefix group has homes is kept to them, and any other (the
tail, a prefix never seen) to the spill engines: `choose_placed` picks the
lowest cost there, and leaves for `choose`'s pick only when none of them is
under the load bound or the least queued of them has more than
`leave_penalty` prompts more queued than the least queued candidate (queued:
the cost less the request's own prefill, so that a home not yet holding the
prefix is not left for the copy elsewhere: that would never move a prefix).
Such a request counts as overflow, which gives its group another home (the
tail another spill engine) at the next plan. Every request with a prompt of a
block or more is counted in its group's traffic, plan or not.

The decisions (`choose`, `choose_placed`) are pure functions of the
candidates and their predicted cached tokens; `KvAware.select` only asks the
index for those and counts the traffic.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headcount.fleet import Engine, EngineLoad
from headcount.routing.kv.planning import Placement
from headcount.routing.kv.request import KvIndexView, KvRequest

if TYPE_CHECKING:  # `routing.policy` loads this package before it defines them; a parse
    # worker must not load tokenizers
    from headcount.routing.policy import KeySource, RequestFeatures
    from headcount.tokens import ChatTokenizer

__all__ = ["KvAware", "KvRouting", "choose", "choose_placed", "ttft_cost"]


@dataclass(frozen=True, slots=True)
class KvRouting:
    """What the `kv-aware` policy needs besides the snapshot."""

    index: KvIndexView
    tokenizer: ChatTokenizer | None
    """The router's own tokenizer; None: an engine's `POST /tokenize` is asked."""
    tokenize_timeout: float = 1.0
    """An engine's `/tokenize` answering later is given up: the request is routed by load."""
    tokenize_answer_max: int = 1 << 20
    """Bytes of a `/tokenize` answer read at most; a larger one is given up."""
    inline_tokenize_max: int = 32 * 1024
    """Request bodies up to this many bytes are tokenized on the event loop (at most ~5 ms
    of encoding even with nothing cached); larger ones are routed by load."""
    waiting_tokens: float = 512.0
    """What one scraped waiting request on an engine costs, in prompt tokens."""
    full_usage: float = 0.9
    """KV-cache usage past which an engine's cost grows, to a whole prompt more at 100%."""
    miss_weight: float = 4.0
    """What an uncached prompt token costs in choosing an engine: its prefill now, and the
    cached tokens it evicts there, which other requests then prefill again. 4, not 2: 3 to
    4 points more hits under cache pressure, 1 to 2 on a fleet the prompts fit, lower TTFT
    on both, level on the uniform workload (bench/RESULTS.md, issue 24)."""
    saturation_slack: int = 8
    """In-flight requests an engine may have over (1 + epsilon) x the mean before it is
    skipped."""
    placement: Placement | None = None
    """Capacity-aware placement (`planning.py`); None: the greedy choice alone."""


def ttft_cost(prompt: int, cached: int, load: EngineLoad, routing: KvRouting) -> float:
    """An engine's predicted time to first token for a request, in prompt tokens."""
    waiting = load.waiting if load.waiting > load.awaiting else load.awaiting
    cost = prompt - cached + load.prefill_queued + routing.waiting_tokens * waiting
    usage = load.kv_usage
    if usage is not None and usage > routing.full_usage:
        cost += prompt * min(1.0, (usage - routing.full_usage) / (1.0 - routing.full_usage))
    return cost


def choose(
    candidates: Sequence[Engine],
    cached: Sequence[int],
    prompt: int,
    routing: KvRouting,
    *,
    epsilon: float,
    start: int,
) -> Engine | None:
    """The engine with the lowest `ttft_cost` among those under the load bound (all, if none
    is); `cached[i]` is what `candidates[i]` holds of the prompt, `start` rotates ties."""
    bound = _bound(candidates, routing, epsilon)
    return _lowest(candidates, cached, prompt, routing, bound, start, range(len(candidates)))


def choose_placed(
    candidates: Sequence[Engine],
    cached: Sequence[int],
    prompt: int,
    routing: KvRouting,
    *,
    epsilon: float,
    start: int,
    homes: Collection[str],
    penalty: float,
) -> tuple[Engine | None, bool]:
    """`choose` kept to the engines named in `homes` (a prefix's homes, or the spill engines)
    while one of them is under the load bound and has at most `penalty` more queued (its
    predicted cost less its uncached part) than the least queued candidate; and whether the
    request left them for `choose`'s pick."""
    bound = _bound(candidates, routing, epsilon)
    everywhere = range(len(candidates))
    inside = [i for i, engine in enumerate(candidates) if engine.id in homes]
    home = _lowest(candidates, cached, prompt, routing, bound, start, inside) if inside else None
    if home is not None:
        queued = min(_queued(engine.load, routing) for engine in candidates)
        if _queued(home.load, routing) - queued <= penalty:
            return home, False
    best = _lowest(candidates, cached, prompt, routing, bound, start, everywhere)
    return best, bool(inside) and best is not None and best.id not in homes


def _queued(load: EngineLoad, routing: KvRouting) -> float:
    """What an engine's predicted cost holds besides the request's own prefill."""
    return ttft_cost(0, 0, load, routing)


def _bound(candidates: Sequence[Engine], routing: KvRouting, epsilon: float) -> int | None:
    """In-flight requests at which an engine is skipped; None: all are past it."""
    count = len(candidates)
    if count == 0:
        return None
    total = sum(engine.load.in_flight for engine in candidates) + 1
    bound = math.ceil((1 + epsilon) * total / count) + routing.saturation_slack
    return bound if any(engine.load.in_flight < bound for engine in candidates) else None


def _lowest(
    candidates: Sequence[Engine],
    cached: Sequence[int],
    prompt: int,
    routing: KvRouting,
    bound: int | None,
    start: int,
    among: Sequence[int],
) -> Engine | None:
    """Of `candidates[i]` for i in `among`, under `bound`, the one of lowest cost."""
    count = len(among)
    best: Engine | None = None
    best_key = (0.0, 0)
    for offset in range(count):
        index = among[(start + offset) % count]
        engine = candidates[index]
        load = engine.load
        if bound is not None and load.in_flight >= bound:
            continue
        uncached = prompt - cached[index]
        cost = ttft_cost(prompt, cached[index], load, routing)
        key = (cost + (routing.miss_weight - 1) * uncached, load.in_flight)
        if best is None or key < best_key:
            best, best_key = engine, key
    return best


class KvAware:
    """The `kv-aware` policy; requests carry their prompt in `RequestFeatures.kv`."""

    name = "kv-aware"
    key_source: KeySource | None = None

    def __init__(self, routing: KvRouting, *, epsilon: float) -> None:
        self.routing = routing
        self._epsilon = epsilon
        self._cursor = 0

    def request(self, model: str, ids: Sequence[int] | None) -> KvRequest:
        """The kv-aware side of a request for `model` with prompt `ids` (None: not known)."""
        return KvRequest(self.routing.index, model, ids)

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None:
        kv = request.kv
        prompt = 0 if kv is None else kv.prompt_tokens
        cached = [0] * len(candidates) if kv is None else [kv.cached(e) for e in candidates]
        self._cursor += 1
        placement = self.routing.placement
        group = plan = None
        if placement is not None and kv is not None and candidates:
            keys, size = kv.keys(candidates[0])
            group = placement.traffic.observe(keys, prompt / size if size else 0.0)
            plan = placement.current()
        if placement is None or plan is None or group is None:
            return choose(
                candidates, cached, prompt, self.routing, epsilon=self._epsilon, start=self._cursor
            )
        homes = plan.homes.get(group)
        engine, left = choose_placed(
            candidates,
            cached,
            prompt,
            self.routing,
            epsilon=self._epsilon,
            start=self._cursor,
            homes=plan.spill if homes is None else homes,
            penalty=placement.settings.leave_penalty * prompt,
        )
        if left:
            placement.traffic.overflowed(None if homes is None else group)
        return engine
