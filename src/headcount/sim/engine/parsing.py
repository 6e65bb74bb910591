"""What a request asks the engine for: OpenAI bodies parsed and checked as vLLM checks them.

A malformed body or an unknown model gets vLLM's status and error type (400
BadRequestError, 404 NotFoundError), never a generation. The prompt becomes
token ids (`prompts`), and its text's last tokens the context the answer
continues (`tokens`); `max_completion_tokens` counts as `max_tokens` for chats.
`stream_options` reads as vLLM's pydantic model does: an object without
`include_usage` asks for usage (its default), `continuous_usage_stats` counts
only with it, and options on a request that does not stream are refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from headcount.sim.engine.prompts import chat_prompt_ids, completion_prompt_ids
from headcount.sim.engine.tokens import EMPTY_CONTEXT, Context, request_context
from headcount.sim.engine.wire import RequestError, bad_request
from headcount.tokens import ChatTokenizer

__all__ = [
    "Generation",
    "Kind",
    "embedding_inputs",
    "parse_generation",
    "parse_object",
    "requested_model",
]

Kind = Literal["chat", "completion"]

_DEFAULT_MAX_TOKENS = 16
_MAX_TOKENS_CAP = 4096


@dataclass(frozen=True, slots=True)
class Generation:
    """A validated chat or text completion request."""

    kind: Kind
    model: str
    stream: bool
    max_tokens: int
    include_usage: bool
    prompt_ids: Sequence[int]
    continuous_usage: bool = False
    """Usage on every chunk too (`stream_options.continuous_usage_stats`)."""
    context: Context = EMPTY_CONTEXT
    """The end of the request's text, which the answer continues (`tokens`)."""

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


def parse_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body


def requested_model(body: dict[str, Any], base_model: str, served: frozenset[str]) -> str:
    model = body.get("model", base_model)
    if not isinstance(model, str):
        raise bad_request("`model` must be a string")
    if model not in served:
        raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError")
    return model


def _max_tokens(body: dict[str, Any], kind: Kind) -> int:
    value = body.get("max_completion_tokens") if kind == "chat" else None
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return _DEFAULT_MAX_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_request("`max_tokens` must be a positive integer")
    return min(value, _MAX_TOKENS_CAP)


def parse_generation(
    raw: bytes, kind: Kind, base_model: str, served: frozenset[str], tokenizer: ChatTokenizer
) -> Generation:
    body = parse_object(raw)
    model = requested_model(body, base_model, served)
    prompt_ids = (chat_prompt_ids if kind == "chat" else completion_prompt_ids)(body, tokenizer)
    stream = body.get("stream") is True
    include_usage, continuous_usage = _stream_usage(body.get("stream_options"), stream)
    return Generation(
        kind=kind,
        model=model,
        stream=stream,
        max_tokens=_max_tokens(body, kind),
        include_usage=include_usage,
        prompt_ids=prompt_ids,
        continuous_usage=continuous_usage,
        context=request_context(body, kind),
    )


def _stream_usage(options: object, stream: bool) -> tuple[bool, bool]:
    """vLLM's reading of `stream_options`: the usage chunk, and usage on every chunk."""
    if options and not stream:
        raise bad_request("Stream options can only be defined when `stream=True`.")
    if options is None or not stream:
        return False, False
    if not isinstance(options, dict):
        raise bad_request("`stream_options` must be an object")
    include = options.get("include_usage", True)
    continuous = options.get("continuous_usage_stats", False)
    if not all(value is None or isinstance(value, bool) for value in (include, continuous)):
        raise bad_request("`stream_options` fields must be booleans")
    return include is True, include is True and continuous is True


def embedding_inputs(body: dict[str, Any]) -> list[object]:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, int) for item in value):
            return [value]
        if all(isinstance(item, str | list) for item in value):
            return value
    raise bad_request("`input` must be a string, a list of strings or token id lists")
