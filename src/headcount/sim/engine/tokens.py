"""What the engine generates: text that continues its request's text, resumable on any engine.

A router that resumes a broken stream asks another engine to continue from the
text already relayed (a chat's messages plus an assistant message holding it,
with `continue_final_message`; a completion's prompt followed by it). For that
answer to be checkable, what an engine generates must depend on the text
before it and on nothing else: the next token is a function of the last three
tokens of that text (`CONTEXT`), so an answer resumed after any k of its
tokens goes on, on any engine, with exactly tokens k+1.. of the uninterrupted one.

- Tokens: text split by the regex ``" ?\\w+|[^\\w ]"`` (a word with its leading
  space, or one other character but a space; lone spaces are dropped), each
  stripped of its leading space.
- The text before the answer (`request_context`): a chat's messages' text
  content in order, each message split alone (a list of content parts is its
  text parts joined by newlines, as vLLM gives them to a string template),
  whether or not the final one is continued; a completion's string prompt. A
  prompt of token ids counts as the text of its ids in decimal: such a prompt
  gets its own answer, but cannot be resumed as text.
- The next token: ``blake2b`` (8 bytes, big-endian) of the last three tokens
  joined by NUL, modulo the `VOCABULARY`'s size, moved on (cyclically) past
  the previous token and past punctuation after anything but a word, so the
  text neither stutters nor piles up punctuation. Fewer than three tokens
  count as empty strings before them.
- Every vocabulary token is a word with one leading space or a lone "," or
  ".", so the answer splits back into exactly its tokens, and a prompt
  followed by any of its tokens splits into the prompt's tokens and those.
- Answers are eventually periodic (three tokens of 40 are 64,000 states), often
  within a hundred tokens, and answers to different texts may merge after a
  while: each answer's start is its own.

Streams are the benchmarks' hot path: an answer is computed once per
(context, length) and kept as the JSON strings a chunk splices in
(`answer_json`); no JSON is encoded per token. With a prefix cache the
generated tokens need ids too (`output_ids`): the tokenizer's ids of the
answer's text, cut (or cycled) to exactly the number of tokens generated.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from headcount.tokens import ChatTokenizer, PromptKind
from headcount.tokens.requests import completion_prompt
from headcount.tokens.template import text_of_parts

__all__ = [
    "CONTEXT",
    "EMPTY_CONTEXT",
    "VOCABULARY",
    "Context",
    "answer",
    "answer_json",
    "answer_text",
    "context_of",
    "output_ids",
    "request_context",
    "split",
]

Context = tuple[str, str, str]
"""The last three tokens of the text before a token, leading spaces stripped."""
CONTEXT = 3
EMPTY_CONTEXT: Context = ("", "", "")

_WORDS = """
    the a one each every next same of to and in on with from again here now more
    engine router token stream request answer cache model prefix block queue reply
    sends reads keeps moves waits serves resumes counts
"""
VOCABULARY = (*(" " + word for word in _WORDS.split()), ",", ".")
"""What the engine says: 38 words, each with one leading space, and two punctuation marks."""
_TOKEN_JSON = tuple(json.dumps(token).encode() for token in VOCABULARY)
_STRIPPED = tuple(token.removeprefix(" ") for token in VOCABULARY)
_PUNCTUATION = frozenset(i for i, token in enumerate(VOCABULARY) if not token.startswith(" "))
_SPLIT = re.compile(r" ?\w+|[^\w ]")
_WORD = re.compile(r"\w")
_TAIL = 256
"""Characters at the end of a text searched first for its last tokens."""


def split(text: str) -> list[str]:
    """`text`'s tokens, each with its leading space: joined, they give `text` back but for
    the spaces that lead no word."""
    return _SPLIT.findall(text)


def _last_tokens(text: str) -> list[str]:
    """The last `CONTEXT` tokens of `text` (fewer if it has fewer), leading spaces stripped.

    A long text is searched from near its end: a search begun inside a token gets that
    token wrong but every one after it right, so more than `CONTEXT` tokens found there
    end with the right ones."""
    tokens: list[str] = []
    if len(text) > _TAIL:
        tokens = _SPLIT.findall(text, len(text) - _TAIL)
    if len(tokens) <= CONTEXT:
        tokens = _SPLIT.findall(text)
    return [token.removeprefix(" ") for token in tokens[-CONTEXT:]]


def context_of(texts: Iterable[str]) -> Context:
    """The context after `texts`, each split alone, one after the other."""
    tokens: list[str] = []
    for text in texts:
        tokens = [*tokens, *_last_tokens(text)][-CONTEXT:]
    padded = ["", "", "", *tokens]
    return padded[-3], padded[-2], padded[-1]


def _message_text(message: object) -> str:
    """A chat message's text: its content string, or its text parts as a template sees them."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        return text_of_parts(content)
    return content if isinstance(content, str) else ""


def request_context(body: Mapping[str, Any], kind: PromptKind) -> Context:
    """The context an answer to the request `body` starts from (see the module docstring).

    `RequestTokensError` for a completion whose prompt is not one prompt."""
    if kind == "chat":
        messages = body.get("messages")
        return context_of(map(_message_text, messages if isinstance(messages, list) else ()))
    prompt = completion_prompt(body)
    if isinstance(prompt, str):
        return context_of((prompt,))
    return context_of(str(token) for token in prompt[-CONTEXT:])


@functools.lru_cache(maxsize=1 << 16)
def _successor(context: Context) -> int:
    """The vocabulary index of the token after `context`."""
    seed = "\0".join(context).encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(seed, digest_size=8).digest()
    index = int.from_bytes(digest, "big") % len(VOCABULARY)
    previous = context[-1]
    after_word = _WORD.match(previous[-1:]) is not None
    while _STRIPPED[index] == previous or (index in _PUNCTUATION and not after_word):
        index = (index + 1) % len(VOCABULARY)
    return index


@functools.lru_cache(maxsize=512)
def _indices(context: Context, tokens: int) -> tuple[int, ...]:
    indices: list[int] = []
    a, b, c = context
    for _ in range(tokens):
        index = _successor((a, b, c))
        indices.append(index)
        a, b, c = b, c, _STRIPPED[index]
    return tuple(indices)


@functools.lru_cache(maxsize=512)
def answer_json(context: Context, tokens: int) -> tuple[bytes, ...]:
    """The first `tokens` tokens after `context`, each a JSON string to splice into a chunk."""
    return tuple(_TOKEN_JSON[index] for index in _indices(context, tokens))


@functools.lru_cache(maxsize=512)
def answer(context: Context, tokens: int) -> str:
    """The first `tokens` tokens after `context`, joined: a whole answer's text."""
    return "".join(VOCABULARY[index] for index in _indices(context, tokens))


def answer_text(body: Mapping[str, Any], kind: PromptKind, tokens: int) -> str:
    """The text of the first `tokens` tokens the engine answers the request `body` with.

    A pure function of the body's messages (a chat) or prompt (a completion): what the
    engine sends, streamed or not, whole or resumed, is this text's start. The engine
    generates `max_tokens` tokens (`max_completion_tokens` first for a chat; 16 if
    neither is set; at most 4096)."""
    return answer(request_context(body, kind), tokens)


@functools.lru_cache(maxsize=1024)
def output_ids(tokenizer: ChatTokenizer, context: Context, tokens: int) -> tuple[int, ...]:
    """The ids of the first `tokens` tokens after `context`, by `tokenizer`."""
    ids = tokenizer.encode(answer(context, tokens), add_special_tokens=False)
    return tuple(itertools.islice(itertools.cycle(ids), tokens))
