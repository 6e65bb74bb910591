"""Encoding long, repeated text once: the pieces between a chat template's special tokens, cached.

Tokenizing costs about a millisecond per thousand tokens, and a chat sent to a
fleet repeats most of its text (a tenant's system prompt, a conversation's
earlier turns). A tokenizer encodes the text between two added tokens on its
own, so a rendered chat cut at those tokens encodes piece by piece to the same
ids; the pieces are cached, least recently used first out, within a bound in
bytes: each entry counts its text's and its ids' sizes as Python holds them
(`sys.getsizeof`) plus the cache's own bookkeeping, and the ids are kept as a
4-byte `array`, not a list of Python ints (8 bytes of pointer plus a 32-byte
object each). A piece larger than the whole bound is encoded, never kept.

Text is cut only at the added tokens the chat template writes (plus the named
special tokens), and only at those that are a `cut_point` and that no other
added token contains or overlaps from the left, since the tokenizer matches
added tokens leftmost-longest. With `add_special_tokens`, the ids the
tokenizer adds around a text (a BOS, say) are learnt once from a probe and put
around the pieces; a tokenizer whose additions the probe cannot find is not cut.
"""

from __future__ import annotations

import re
import sys
from array import array
from collections import OrderedDict
from collections.abc import Iterable

from headcount.tokens.vocabulary import Vocabulary

__all__ = ["Segments"]

_PROBE = "probe"
_ENTRY_BYTES = 104
"""What one cached piece costs beyond its text and ids: the ordered dict's slot and link."""


class Segments:
    """A vocabulary's `encode`, cutting text at safe special tokens and caching the pieces."""

    def __init__(self, vocabulary: Vocabulary, wanted: Iterable[str], capacity: int) -> None:
        """`capacity`: bytes the cached pieces may hold at most."""
        self._vocabulary = vocabulary
        self._capacity = capacity
        self._cache: OrderedDict[str, array[int]] = OrderedDict()
        self.held = 0
        """Bytes the cached pieces hold now, as counted against `capacity`."""
        contents = [token.content for token in vocabulary.added_tokens]
        allowed = {token.content for token in vocabulary.added_tokens if token.cut_point}
        cuts = sorted(
            {token for token in wanted if token in allowed and _cuts_alone(token, contents)},
            key=len,
            reverse=True,
        )
        self._cut_ids = {token: vocabulary.encode(token, False) for token in cuts}
        self._pattern = (
            re.compile("(" + "|".join(re.escape(token) for token in cuts) + ")") if cuts else None
        )
        self._affixes = _affixes(vocabulary)

    @property
    def cuts(self) -> tuple[str, ...]:
        """The special tokens text is cut at (none: every text is encoded whole)."""
        return tuple(self._cut_ids)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        affixes = self._affixes if add_special_tokens else ([], [])
        if self._pattern is None or affixes is None:
            return self._vocabulary.encode(text, add_special_tokens)
        head, tail = affixes
        ids = list(head)
        for index, part in enumerate(self._pattern.split(text)):
            if index % 2:
                ids += self._cut_ids[part]
            elif part:
                ids += self._piece(part)
        ids += tail
        return ids

    def _piece(self, text: str) -> list[int]:
        cache = self._cache
        kept = cache.get(text)
        if kept is not None:
            cache.move_to_end(text)
            return kept.tolist()
        ids = self._vocabulary.encode(text, False)
        try:
            kept = array("I", ids)
        except OverflowError:  # an id over 2**32 - 1: no tokenizer has one
            return ids
        size = _cost(text, kept)
        if size <= self._capacity:
            cache[text] = kept
            self.held += size
            while self.held > self._capacity:
                self.held -= _cost(*cache.popitem(last=False))
        return ids


def _cost(text: str, ids: array[int]) -> int:
    return sys.getsizeof(text) + sys.getsizeof(ids) + _ENTRY_BYTES


def _cuts_alone(token: str, contents: list[str]) -> bool:
    """No other added token contains `token`, or ends with the beginning of it."""
    return not any(
        other != token
        and (token in other or any(other.endswith(token[:k]) for k in range(1, len(token))))
        for other in contents
    )


def _affixes(vocabulary: Vocabulary) -> tuple[list[int], list[int]] | None:
    """The ids `add_special_tokens` puts before and after a text, or None if not found."""
    bare = vocabulary.encode(_PROBE, False)
    full = vocabulary.encode(_PROBE, True)
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    return None
