"""A request's prompt as token ids, as vLLM computes them, for generation, `/tokenize` and render.

- Chat (`messages`): the chat template renders the messages (with the
  request's `add_generation_prompt`, default true; `continue_final_message`,
  default false; `tools`; `chat_template_kwargs`), then the tokenizer encodes
  the text, adding special tokens only if `add_special_tokens` (default false).
- Completion (`prompt`): a string is encoded with `add_special_tokens`
  (default true), token ids are used as they are; a list holding one prompt
  is that prompt. The simulator serves one prompt per request.

A template that refuses the chat, a request-supplied `chat_template` (vLLM
needs `--trust-request-chat-template` for it) and an empty prompt are 400s.
"""

from __future__ import annotations

from typing import Any

from headcount.sim.engine.wire import bad_request
from headcount.tokens import ChatTemplateError, ChatTokenizer

__all__ = ["chat_prompt_ids", "completion_prompt_ids", "tokenize"]


def tokenize(
    body: dict[str, Any], tokenizer: ChatTokenizer, *, strings: bool
) -> tuple[list[int], list[str] | None]:
    """vLLM's `/tokenize`: a chat (`messages`) or a string `prompt`, as ids and, if asked,
    the tokens' strings."""
    if "messages" in body:
        text, special = _chat_text(body, tokenizer), _flag(body, "add_special_tokens", False)
    elif isinstance(body.get("prompt"), str):
        text, special = body["prompt"], _flag(body, "add_special_tokens", True)
    else:
        raise bad_request("a tokenize request needs `messages` or a string `prompt`")
    ids = tokenizer.encode(text, add_special_tokens=special)
    return ids, tokenizer.token_strs(text, add_special_tokens=special) if strings else None


def chat_prompt_ids(body: dict[str, Any], tokenizer: ChatTokenizer) -> list[int]:
    text = _chat_text(body, tokenizer)
    special = _flag(body, "add_special_tokens", False)
    return _not_empty(tokenizer.encode(text, add_special_tokens=special))


def _chat_text(body: dict[str, Any], tokenizer: ChatTokenizer) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise bad_request("`messages` must be a list")
    if body.get("chat_template") is not None:
        raise bad_request("a request's own chat_template is not trusted")
    tools = body.get("tools")
    kwargs = body.get("chat_template_kwargs")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("`tools` must be a list")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad_request("`chat_template_kwargs` must be an object")
    try:
        return tokenizer.render(
            messages,
            add_generation_prompt=_flag(body, "add_generation_prompt", True),
            continue_final_message=_flag(body, "continue_final_message", False),
            tools=tools,
            chat_template_kwargs=kwargs,
        )
    except ChatTemplateError as exc:
        raise bad_request(str(exc)) from None


def completion_prompt_ids(body: dict[str, Any], tokenizer: ChatTokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        add_special_tokens = _flag(body, "add_special_tokens", True)
        return _not_empty(tokenizer.prompt_ids(prompt, add_special_tokens=add_special_tokens))
    if isinstance(prompt, list) and all(_is_token_id(item) for item in prompt):
        return _not_empty(tokenizer.prompt_ids(prompt))
    raise bad_request("`prompt` must be a string or a list of token ids (one prompt)")


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"`{name}` must be a boolean")
    return value


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _not_empty(ids: list[int]) -> list[int]:
    if not ids:
        raise bad_request("the prompt is empty")
    return ids
