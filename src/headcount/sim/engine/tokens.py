"""Tokens in and out: a word count standing in for a tokenizer, and the text the engine generates.

Usage numbers and stream chunks need tokens, not meaning: a prompt counts one
token per word (or per token id), and the output cycles through one fixed
sentence, one token per chunk.
"""

from __future__ import annotations

import functools
import json
import re

__all__ = ["TOKEN_JSON", "count_words", "text"]

_VOCABULARY = tuple(
    re.findall(r" ?\w+|[^\w ]", "Hello from the simulated engine, one token at a time.")
)
TOKEN_JSON = tuple(json.dumps(token).encode() for token in _VOCABULARY)
"""Each generated token as a JSON string, ready to splice into a stream chunk."""


def count_words(value: object) -> int:
    """A cheap stand-in for a tokenizer: words in text, one per token id."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, int):
        return 1
    if isinstance(value, list):
        return sum(count_words(item) for item in value)
    if isinstance(value, dict):
        return count_words(value.get("content", value.get("text")))
    return 0


@functools.lru_cache(maxsize=64)
def text(tokens: int) -> str:
    """The first `tokens` generated tokens, joined."""
    size = len(_VOCABULARY)
    return "".join(_VOCABULARY[i % size] for i in range(tokens))
