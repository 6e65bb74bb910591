"""Routing: given the candidate engines and the request, pick one.

    round-robin   each engine in turn                                   (load.py)
    least-loaded  fewest requests: this router's in-flight plus the     (load.py)
                  scraped queue
    session       same `x-session-id` header (or body `user`) -> same   (affinity.py)
                  engine
    prefix        same prompt beginning -> same engine (its prefix      (affinity.py)
                  cache is warm)
    kv-aware      lowest predicted time to first token from the         (kv/)
                  engines' own KV caches and their queued prefill

The contract every policy meets is `policy.py`; `make_policy` builds one by
its name (`config.RoutingName`).
"""

from __future__ import annotations

from headcount.config import RoutingName
from headcount.routing.affinity import PREFIX_CHARS, Affinity, prompt_prefix_key, session_key
from headcount.routing.kv.policy import KvAware, KvRouting
from headcount.routing.load import LeastLoaded, RoundRobin
from headcount.routing.policy import (
    HeaderLookup,
    KeySource,
    PinnedFeatures,
    Policy,
    RequestFeatures,
)

__all__ = [
    "PREFIX_CHARS",
    "Affinity",
    "HeaderLookup",
    "KeySource",
    "LeastLoaded",
    "PinnedFeatures",
    "Policy",
    "RequestFeatures",
    "RoundRobin",
    "make_policy",
    "prompt_prefix_key",
    "session_key",
]


def make_policy(
    name: RoutingName, *, affinity_epsilon: float, kv: KvRouting | None = None
) -> Policy:
    """The policy called `name`; `affinity_epsilon` bounds the load of session, prefix and
    kv-aware, which also needs `kv` (its index, tokenizer and costs)."""
    if name is RoutingName.KV_AWARE:
        if kv is None:
            raise ValueError("the kv-aware policy needs the engines' cache indexes (kv=...)")
        return KvAware(kv, epsilon=affinity_epsilon)
    if name is RoutingName.LEAST_LOADED:
        return LeastLoaded()
    if name is RoutingName.SESSION:
        return Affinity(name.value, session_key, epsilon=affinity_epsilon)
    if name is RoutingName.PREFIX:
        return Affinity(name.value, prompt_prefix_key, epsilon=affinity_epsilon)
    return RoundRobin()
