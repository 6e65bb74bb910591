"""The built-in tokenizer and ChatML template, so engines and routers run with no model files.

Deterministic and documented, so anyone can predict its ids:

- Three special tokens, matched first: ``<|endoftext|>`` = 0,
  ``<|im_start|>`` = 1, ``<|im_end|>`` = 2.
- Other text is cut into pieces by the regex ``" ?\\w+| ?[^\\w\\s]+|\\s+"``
  (a word with its leading space, a run of punctuation with its leading space,
  or a run of whitespace): one token per piece, so English text counts
  roughly as many tokens as it has words, a little fewer than a BPE model.
- A piece's id is ``3 + (the first 8 bytes of blake2b(piece as UTF-8),
  big-endian) mod (VOCAB_SIZE - 3)``, with VOCAB_SIZE = 2**17.
- No BOS or EOS is ever added (`add_special_tokens` changes nothing).

The chat template is ChatML, the shape of Qwen's: each message is
``<|im_start|>{role}\\n{content}<|im_end|>\\n``; the generation prompt is
``<|im_start|>assistant\\n``.
"""

from __future__ import annotations

import functools
import hashlib
import re

from headcount.tokens.vocabulary import AddedToken

__all__ = ["CHATML_TEMPLATE", "SPECIAL_TOKENS", "VOCAB_SIZE", "BuiltinVocabulary"]

VOCAB_SIZE = 2**17
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Ids 0, 1, 2."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_SPECIAL_IDS = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
_SPECIAL = re.compile("(" + "|".join(re.escape(token) for token in SPECIAL_TOKENS) + ")")
_PIECE = re.compile(r" ?\w+| ?[^\w\s]+|\s+")


_CACHED_PIECE = 16
"""Pieces up to this many characters have their ids cached: nearly every English word, so
the cache saves most hashing, and 32,768 entries of at most ~300 bytes each (a 16-character
str of 4-byte characters, its id, the LRU's link) bound it to under 10 MiB."""


def _piece_id(piece: str) -> int:
    if len(piece) <= _CACHED_PIECE:
        return _short_piece_id(piece)
    return _hashed_id(piece)


def _hashed_id(piece: str) -> int:
    digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
    return len(SPECIAL_TOKENS) + int.from_bytes(digest, "big") % (VOCAB_SIZE - len(SPECIAL_TOKENS))


_short_piece_id = functools.lru_cache(maxsize=1 << 15)(_hashed_id)


class BuiltinVocabulary:
    """Pieces of text to hashed ids; see the module docstring."""

    added_tokens = tuple(AddedToken(token, cut_point=True) for token in SPECIAL_TOKENS)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        special = _SPECIAL_IDS
        return [
            special[piece] if piece in special else _piece_id(piece)
            for piece in self.token_strs(text, add_special_tokens)
        ]

    def token_strs(self, text: str, add_special_tokens: bool) -> list[str]:
        pieces: list[str] = []
        for index, part in enumerate(_SPECIAL.split(text)):
            if index % 2:
                pieces.append(part)
            else:
                pieces += _PIECE.findall(part)
        return pieces
