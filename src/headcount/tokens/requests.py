"""A request body's prompt as token ids, as vLLM computes them: one code for engine and router.

The simulated engine tokenizes a request to run it (and for `/tokenize` and
render); the router tokenizes the same body to predict which engine holds its
prefix. Both must get the same ids, so both use this module.

- Chat (`messages`): the chat template renders the messages (with the
  request's `add_generation_prompt`, default true; `continue_final_message`,
  default false; `tools`; `chat_template_kwargs`), then the tokenizer encodes
  the text, adding special tokens only if `add_special_tokens` (default false).
- Completion (`prompt`): a string is encoded with `add_special_tokens`
  (default true), token ids are used as they are; a list holding one prompt
  is that prompt. One prompt per request.

A body that cannot be tokenized raises `RequestTokensError` (the engine's 400):
a template that refuses the chat, a request-supplied `chat_template` (vLLM
needs `--trust-request-chat-template` for it), a malformed field, an empty prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from headcount.tokens.chat import ChatTokenizer
from headcount.tokens.errors import ChatTemplateError, TokenizerError

__all__ = [
    "PromptKind",
    "RequestTokensError",
    "chat_prompt_ids",
    "completion_prompt",
    "completion_prompt_ids",
    "prompt_ids",
    "tokenize",
]

PromptKind = Literal["chat", "completion"]

Body = Mapping[str, Any]


class RequestTokensError(TokenizerError):
    """A request body that cannot be tokenized; the engine answers it 400."""


def prompt_ids(body: Body, kind: PromptKind, tokenizer: ChatTokenizer) -> list[int]:
    """The prompt's ids of a chat or completion request body."""
    if kind == "chat":
        return chat_prompt_ids(body, tokenizer)
    return completion_prompt_ids(body, tokenizer)


def tokenize(
    body: Body, tokenizer: ChatTokenizer, *, strings: bool
) -> tuple[list[int], list[str] | None]:
    """vLLM's `/tokenize`: a chat (`messages`) or a string `prompt`, as ids and, if asked,
    the tokens' strings."""
    if "messages" in body:
        text, special = _chat_text(body, tokenizer), _flag(body, "add_special_tokens", False)
    elif isinstance(body.get("prompt"), str):
        text, special = body["prompt"], _flag(body, "add_special_tokens", True)
    else:
        raise RequestTokensError("a tokenize request needs `messages` or a string `prompt`")
    ids = tokenizer.encode(text, add_special_tokens=special)
    return ids, tokenizer.token_strs(text, add_special_tokens=special) if strings else None


def chat_prompt_ids(body: Body, tokenizer: ChatTokenizer) -> list[int]:
    text = _chat_text(body, tokenizer)
    special = _flag(body, "add_special_tokens", False)
    return _not_empty(tokenizer.encode(text, add_special_tokens=special))


def completion_prompt_ids(body: Body, tokenizer: ChatTokenizer) -> list[int]:
    prompt = completion_prompt(body)
    if isinstance(prompt, str):
        add_special_tokens = _flag(body, "add_special_tokens", True)
        return _not_empty(tokenizer.prompt_ids(prompt, add_special_tokens=add_special_tokens))
    return _not_empty(tokenizer.prompt_ids(prompt))


def completion_prompt(body: Body) -> str | list[int]:
    """A completion request's one prompt: text, or token ids as given."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(_is_token_id(item) for item in prompt):
        return prompt
    raise RequestTokensError("`prompt` must be a string or a list of token ids (one prompt)")


def _chat_text(body: Body, tokenizer: ChatTokenizer) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestTokensError("`messages` must be a list")
    if body.get("chat_template") is not None:
        raise RequestTokensError("a request's own chat_template is not trusted")
    tools = body.get("tools")
    kwargs = body.get("chat_template_kwargs")
    if tools is not None and not isinstance(tools, list):
        raise RequestTokensError("`tools` must be a list")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise RequestTokensError("`chat_template_kwargs` must be an object")
    try:
        return tokenizer.render(
            messages,
            add_generation_prompt=_flag(body, "add_generation_prompt", True),
            continue_final_message=_flag(body, "continue_final_message", False),
            tools=tools,
            chat_template_kwargs=kwargs,
        )
    except ChatTemplateError as exc:
        raise RequestTokensError(str(exc)) from None


def _flag(body: Body, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise RequestTokensError(f"`{name}` must be a boolean")
    return value


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _not_empty(ids: list[int]) -> list[int]:
    if not ids:
        raise RequestTokensError("the prompt is empty")
    return ids
