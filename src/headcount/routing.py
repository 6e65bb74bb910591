"""Routing policies: given the candidate engines and the request, pick one.

A policy decides and does nothing else: no I/O, no metrics, no clock. The proxy
filters candidates first (model or adapter, routable state, engines already
tried for this request), then asks the policy. `None` means no candidate.
A policy that routes by affinity names a `key_source`; the proxy extracts that
key from the already-parsed body (and headers) only for such a policy.

    round-robin   each engine in turn
    least-loaded  fewest requests: this router's in-flight plus the scraped queue
    session       same `x-session-id` header (or body `user`) -> same engine
    prefix        same prompt beginning -> same engine (its prefix cache is warm)
    kv-aware      lowest predicted time to first token from the engines' own KV caches
                  and their queued prefill (`headcount.kvroute`)

`session` and `prefix` use rendezvous hashing with bounded load: the key ranks
the engines, and the first one under (1 + epsilon) times the mean in-flight
load takes the request, so a hot key cannot pile onto one engine and an
engine leaving moves only its own keys.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from headcount.fleet import Engine
from headcount.kvroute.policy import KvAware, KvRouting
from headcount.kvroute.request import KvRequest

__all__ = [
    "PREFIX_CHARS",
    "Affinity",
    "HeaderLookup",
    "KeySource",
    "LeastLoaded",
    "Policy",
    "RequestFeatures",
    "RoundRobin",
    "RoutingName",
    "make_policy",
    "prompt_prefix_key",
    "session_key",
]


class RoutingName(enum.StrEnum):
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    SESSION = "session"
    PREFIX = "prefix"
    KV_AWARE = "kv-aware"


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What a policy may read of a request."""

    model: str
    key: str | None = None
    """The affinity key, extracted only for a policy with a `key_source`."""
    kv: KvRequest | None = None
    """The prompt and its cache predictions, only for the `kv-aware` policy."""


HeaderLookup = Callable[[bytes], bytes | None]
"""A request header's value by lower-case name."""

KeySource = Callable[[Mapping[str, Any], HeaderLookup], str | None]
"""Extracts an affinity key from the parsed JSON body and the headers."""


class Policy(Protocol):
    """`select` returns one of `candidates`, or None when there is none."""

    name: str
    key_source: KeySource | None

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None: ...


class RoundRobin:
    """Each engine in turn; the cursor is the only state."""

    name = RoutingName.ROUND_ROBIN.value
    key_source: KeySource | None = None

    def __init__(self) -> None:
        self._cursor = 0

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None:
        if not candidates:
            return None
        self._cursor += 1
        return candidates[self._cursor % len(candidates)]


class LeastLoaded:
    """The engine with the least work: this router's in-flight plus the engine's scraped queue.

    The scrape sees every router replica's traffic, so replicas do not pile onto
    one engine; the in-flight counter reacts between scrapes. Ties go round-robin,
    so an idle fleet is not served by its first engine alone.
    """

    name = RoutingName.LEAST_LOADED.value
    key_source: KeySource | None = None

    def __init__(self) -> None:
        self._cursor = 0

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None:
        count = len(candidates)
        if count == 0:
            return None
        self._cursor += 1
        start = self._cursor % count
        best: Engine | None = None
        best_score = 0.0
        for offset in range(count):
            engine = candidates[(start + offset) % count]
            load = engine.load
            score = load.in_flight + load.running + load.waiting
            if best is None or score < best_score:
                best, best_score = engine, score
        return best


PREFIX_CHARS = 1024
"""How much of the prompt's beginning the prefix key covers (a few KV-cache blocks)."""


def session_key(payload: Mapping[str, Any], header: HeaderLookup) -> str | None:
    """The `x-session-id` header, else the OpenAI `user` field."""
    value = header(b"x-session-id")
    if value:
        return value.decode("latin-1")
    user = payload.get("user")
    return user if isinstance(user, str) and user else None


def prompt_prefix_key(payload: Mapping[str, Any], header: HeaderLookup) -> str | None:
    """The first `PREFIX_CHARS` of the prompt: chat messages' text in order, or `prompt`."""
    parts: list[str] = []
    size = 0
    messages = payload.get("messages")
    texts = _message_texts(messages) if isinstance(messages, list) else _prompt_texts(payload)
    for text in texts:
        parts.append(text)
        size += len(text)
        if size >= PREFIX_CHARS:
            break
    key = "\x1e".join(parts)[:PREFIX_CHARS]
    return key or None


def _message_texts(messages: list[Any]) -> list[str]:
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(
                part["text"]
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
    return texts


def _prompt_texts(payload: Mapping[str, Any]) -> list[str]:
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return [prompt[0]]
    return []


def _rank(key: str, engine: Engine) -> int:
    digest = hashlib.blake2b(f"{key}\x00{engine.id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Affinity:
    """Rendezvous hashing with bounded load over the key from `key_source`.

    Requests without a key are routed least-loaded.
    """

    def __init__(self, name: str, key_source: KeySource, *, epsilon: float) -> None:
        self.name = name
        self.key_source: KeySource | None = key_source
        self._epsilon = epsilon
        self._fallback = LeastLoaded()

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None:
        if not candidates:
            return None
        key = request.key
        if key is None or len(candidates) == 1:
            return self._fallback.select(candidates, request)
        total = sum(engine.load.in_flight for engine in candidates) + 1
        bound = math.ceil((1 + self._epsilon) * total / len(candidates))
        ranked = sorted(candidates, key=lambda engine: _rank(key, engine), reverse=True)
        for engine in ranked:
            if engine.load.in_flight < bound:
                return engine
        return ranked[0]


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
