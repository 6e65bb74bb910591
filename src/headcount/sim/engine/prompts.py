"""A request's prompt as token ids for generation, `/tokenize` and render, refused as vLLM does.

The ids come from `headcount.tokens.requests`, the code the router predicts
them with; here a body it cannot tokenize becomes the engine's 400, and text it
cannot encode (a lone surrogate) its 500, an error of vLLM's shape: vLLM too
answers 500 for some inputs it cannot handle, and never with a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from headcount.sim.engine.wire import RequestError, bad_request
from headcount.tokens import ChatTokenizer, TokenizerError
from headcount.tokens import requests as _requests

__all__ = ["chat_prompt_ids", "completion_prompt_ids", "tokenize"]

_T = TypeVar("_T")


def tokenize(
    body: dict[str, Any], tokenizer: ChatTokenizer, *, strings: bool
) -> tuple[list[int], list[str] | None]:
    """vLLM's `/tokenize`: ids and, if asked, the tokens' strings."""
    return _refusing(lambda: _requests.tokenize(body, tokenizer, strings=strings))


def chat_prompt_ids(body: dict[str, Any], tokenizer: ChatTokenizer) -> list[int]:
    return _refusing(lambda: _requests.chat_prompt_ids(body, tokenizer))


def completion_prompt_ids(body: dict[str, Any], tokenizer: ChatTokenizer) -> list[int]:
    return _refusing(lambda: _requests.completion_prompt_ids(body, tokenizer))


def _refusing(compute: Callable[[], _T]) -> _T:
    try:
        return compute()
    except TokenizerError as exc:
        raise bad_request(str(exc)) from None
    except UnicodeEncodeError as exc:
        raise RequestError(500, f"cannot encode the prompt: {exc}", "InternalServerError") from None
