"""The affinity policies: the same key goes to the same engine, within a bound on its load.

`session` keys on `x-session-id` (or the body's `user`), `prefix` on the
prompt's beginning. Both use rendezvous hashing with bounded load: the key ranks
the engines, and the first one under (1 + epsilon) times the mean in-flight
load takes the request, so a hot key cannot pile onto one engine and an
engine leaving moves only its own keys.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from headcount.fleet import Engine
from headcount.routing.load import LeastLoaded
from headcount.routing.policy import HeaderLookup, KeySource, RequestFeatures

__all__ = [
    "PREFIX_CHARS",
    "Affinity",
    "previous_response_key",
    "prompt_prefix_key",
    "session_key",
]


PREFIX_CHARS = 1024
"""How much of the prompt's beginning the prefix key covers (a few KV-cache blocks)."""


def session_key(payload: Mapping[str, Any], header: HeaderLookup) -> str | None:
    """The `x-session-id` header, else the OpenAI `user` field."""
    value = header(b"x-session-id")
    if value:
        return value.decode("latin-1")
    user = payload.get("user")
    return user if isinstance(user, str) and user else None


def previous_response_key(payload: Mapping[str, Any], header: HeaderLookup) -> str | None:
    """A Responses API request's `previous_response_id`: the response it continues, stored
    on one engine (`proxy/stored_responses.py`), read from a large body by a worker."""
    value = payload.get("previous_response_id")
    return value if isinstance(value, str) and value else None


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
