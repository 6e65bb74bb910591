"""The routing contract: what a policy reads of a request, and what it must answer.

A policy decides and does nothing else: no I/O, no metrics, no clock. The proxy
filters candidates first (model or adapter, routable state, engines already
tried for this request), then asks the policy. `None` means no candidate.
A policy that routes by affinity names a `key_source`; the proxy extracts that
key from the already-parsed body (and headers) only for such a policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from headcount.fleet import Engine
from headcount.routing.kv.request import KvRequest

__all__ = ["HeaderLookup", "KeySource", "PinnedFeatures", "Policy", "RequestFeatures"]


@dataclass(slots=True)
class RequestFeatures:
    """What a policy may read of a request, and not change (a policy decides, no more).

    Compiled (`setup.py`), one is made per request as cheaply as a tuple; frozen, its
    `__init__` would set each field through `object.__setattr__`, interpreted, a
    twentieth of a chat's instructions."""

    model: str
    key: str | None = None
    """The affinity key, extracted only for a policy with a `key_source`."""
    kv: KvRequest | None = None
    """The prompt and its cache predictions, only for the `kv-aware` policy."""


@dataclass(slots=True)
class PinnedFeatures(RequestFeatures):
    """A request only the engine chosen first can answer (it stores the state the request
    continues): no failover, no resume elsewhere. A kind, not a field, so that the common
    request builds no more than it did."""


HeaderLookup = Callable[[bytes], bytes | None]
"""A request header's value by lower-case name."""

KeySource = Callable[[Mapping[str, Any], HeaderLookup], str | None]
"""Extracts an affinity key from the parsed JSON body and the headers."""


class Policy(Protocol):
    """`select` returns one of `candidates`, or None when there is none."""

    name: str
    key_source: KeySource | None

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None: ...
