"""A model's requests as token ids, exactly as vLLM computes them: chats and completion prompts.

- A chat is rendered by the model's chat template (with the special tokens'
  strings and the request's `chat_template_kwargs` as variables), then encoded
  without adding special tokens (only those the template writes are there):
  vLLM's chat default, and transformers' `apply_chat_template(tokenize=True)`.
- A completion prompt is encoded with `add_special_tokens` (vLLM's default
  True adds the tokenizer's BOS, if it has one); a prompt given as token ids is
  used as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict, Unpack

from headcount.config import KvEventsSettings
from headcount.tokens.errors import ChatTemplateError
from headcount.tokens.segments import Segments
from headcount.tokens.template import ChatTemplate
from headcount.tokens.vocabulary import Vocabulary

__all__ = ["SEGMENT_CACHE_BYTES", "ChatOptions", "ChatTokenizer"]

SEGMENT_CACHE_BYTES = KvEventsSettings.tokenizer_cache_size
"""Bytes of encoded pieces of text kept by default (`Segments`), the router's default."""
_RESERVED_KWARGS = frozenset({"tokenize", "chat_template", "messages", "add_generation_prompt"})


class ChatOptions(TypedDict, total=False):
    """How to render a chat, as vLLM's chat requests say it."""

    add_generation_prompt: bool
    """Default true: end with the header of the assistant's turn."""
    continue_final_message: bool
    """Default false: leave the last message open, for the model to continue."""
    tools: Sequence[object] | None
    chat_template_kwargs: Mapping[str, object] | None


class ChatTokenizer:
    """A vocabulary, its chat templates and its special tokens' strings."""

    def __init__(
        self,
        vocabulary: Vocabulary,
        templates: Mapping[str, str],
        special_tokens: Mapping[str, str],
        *,
        name: str,
        cache_bytes: int = SEGMENT_CACHE_BYTES,
    ) -> None:
        """`templates` by name: "default", and "tool_use" for requests with tools, as
        transformers picks them; `cache_bytes` bounds the encoded pieces kept."""
        if "default" not in templates:
            raise ChatTemplateError("a tokenizer needs a default chat template")
        self.name = name
        """Where it came from: a directory, or "builtin"."""
        self._vocabulary = vocabulary
        self._templates = {name: ChatTemplate(source) for name, source in templates.items()}
        self._special_tokens = dict(special_tokens)
        wanted = {
            token.content
            for token in vocabulary.added_tokens
            if any(token.content in source for source in templates.values())
        }
        self._segments = Segments(vocabulary, wanted | set(special_tokens.values()), cache_bytes)

    def render(self, messages: Sequence[object], **options: Unpack[ChatOptions]) -> str:
        """The chat's text, as the model's template writes it."""
        kwargs = dict(options.get("chat_template_kwargs") or {})
        reserved = _RESERVED_KWARGS & kwargs.keys()
        if reserved:
            raise ChatTemplateError(f"chat_template_kwargs may not set {sorted(reserved)}")
        tools = options.get("tools")
        template = self._templates["default"]
        if tools is not None:
            template = self._templates.get("tool_use", template)
        return template.render(
            messages,
            add_generation_prompt=options.get("add_generation_prompt", True),
            continue_final_message=options.get("continue_final_message", False),
            tools=tools,
            variables={**self._special_tokens, **kwargs},
        )

    def chat_ids(
        self,
        messages: Sequence[object],
        *,
        add_special_tokens: bool = False,
        **options: Unpack[ChatOptions],
    ) -> list[int]:
        """The chat's token ids (the tokenizer's BOS etc. on top only with `add_special_tokens`)."""
        return self.encode(self.render(messages, **options), add_special_tokens=add_special_tokens)

    def prompt_ids(
        self, prompt: str | Sequence[int], *, add_special_tokens: bool = True
    ) -> list[int]:
        """A completion prompt's token ids; ids given are kept as they are."""
        if isinstance(prompt, str):
            return self.encode(prompt, add_special_tokens=add_special_tokens)
        return list(prompt)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Any text's ids, the repeated pieces of it from cache."""
        return self._segments.encode(text, add_special_tokens)

    def token_strs(self, text: str, *, add_special_tokens: bool) -> list[str]:
        """The tokens of `text` as strings (vLLM's `return_token_strs`)."""
        return self._vocabulary.token_strs(text, add_special_tokens)
