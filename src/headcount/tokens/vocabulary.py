"""Text to token ids, for a model's tokenizer (HF `tokenizer.json`) or the built-in one.

A `Vocabulary` encodes text exactly as the model's tokenizer does, and says
which of its added tokens a text may be cut at without changing the ids
(`Segments` caches the pieces between them). An added token is such a cut
point when it strips no neighbouring whitespace, needs no word boundary and is
matched on the raw text; no token is when the pre-tokenizer treats the first
piece of a text differently (SentencePiece's Metaspace with `prepend_scheme:
first`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import tokenizers

__all__ = ["AddedToken", "HfVocabulary", "Vocabulary"]


@dataclass(frozen=True, slots=True)
class AddedToken:
    """A token matched before pre-tokenization; `cut_point`: text may be split around it."""

    content: str
    cut_point: bool


class Vocabulary(Protocol):
    """A tokenizer's text-to-ids half."""

    @property
    def added_tokens(self) -> Sequence[AddedToken]: ...

    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...

    def token_strs(self, text: str, add_special_tokens: bool) -> list[str]:
        """The tokens' strings, as transformers' `convert_ids_to_tokens` gives them."""
        ...


class HfVocabulary:
    """A Hugging Face `tokenizer.json`, through the `tokenizers` library."""

    def __init__(self, spec_json: str) -> None:
        spec: dict[str, Any] = json.loads(spec_json)
        self._tokenizer = tokenizers.Tokenizer.from_str(spec_json)
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        raw_only = _no_normalizer(spec.get("normalizer"))
        cuttable = not _prepends_first_piece_only(spec.get("pre_tokenizer"))
        self.added_tokens = tuple(
            AddedToken(token["content"], cuttable and _cut_point(token, raw_only))
            for token in spec.get("added_tokens", ())
        )

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def token_strs(self, text: str, add_special_tokens: bool) -> list[str]:
        tokens: list[str] = self._tokenizer.encode(
            text, add_special_tokens=add_special_tokens
        ).tokens
        return tokens


def _cut_point(token: dict[str, Any], raw_only: bool) -> bool:
    flags = ("lstrip", "rstrip", "single_word")
    return not any(token.get(flag) for flag in flags) and (raw_only or not token.get("normalized"))


def _no_normalizer(normalizer: dict[str, Any] | None) -> bool:
    return normalizer is None or (
        normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")
    )


def _prepends_first_piece_only(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_prepends_first_piece_only(p) for p in pre_tokenizer.get("pretokenizers", ()))
    return (
        pre_tokenizer.get("type") == "Metaspace" and pre_tokenizer.get("prepend_scheme") == "first"
    )
