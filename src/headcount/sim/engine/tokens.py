"""What the engine generates: one fixed sentence, cycled, one token per chunk, and their ids.

Stream chunks need tokens, not meaning. With a prefix cache, the blocks
filled by generated tokens are cached too, so the generated tokens need ids:
the tokenizer's ids of the generated text, cut (or cycled) to exactly the
number of tokens generated.
"""

from __future__ import annotations

import functools
import itertools
import json
import re

from headcount.tokens import ChatTokenizer

__all__ = ["TOKEN_JSON", "output_ids", "text"]

_VOCABULARY = tuple(
    re.findall(r" ?\w+|[^\w ]", "Hello from the simulated engine, one token at a time.")
)
TOKEN_JSON = tuple(json.dumps(token).encode() for token in _VOCABULARY)
"""Each generated token as a JSON string, ready to splice into a stream chunk."""


@functools.lru_cache(maxsize=64)
def text(tokens: int) -> str:
    """The first `tokens` generated tokens, joined."""
    size = len(_VOCABULARY)
    return "".join(_VOCABULARY[i % size] for i in range(tokens))


@functools.lru_cache(maxsize=256)
def output_ids(tokenizer: ChatTokenizer, tokens: int) -> tuple[int, ...]:
    """The ids of the first `tokens` generated tokens, by `tokenizer`."""
    ids = tokenizer.encode(text(tokens), add_special_tokens=False)
    return tuple(itertools.islice(itertools.cycle(ids), tokens))
