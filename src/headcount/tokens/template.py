"""Chat templates rendered as transformers' `apply_chat_template` renders them, so ids match vLLM's.

A model's chat template (Jinja, shipped in its tokenizer_config.json or
chat_template.jinja) decides the text an engine tokenizes for a chat; whoever
predicts an engine's prefix cache must render exactly that text. The
environment copies transformers 5's: a sandboxed, immutable Jinja environment
with `trim_blocks` and `lstrip_blocks`, loop controls, the `{% generation %}`
tag, a `tojson` that does not escape HTML, and the globals `raise_exception`,
`strftime_now`, `dict` and a `namespace` refusing `_`-prefixed names.

Messages are prepared as transformers prepares them (keys whose value is None
are dropped; `reasoning_content`, `reasoning` and `thinking` are copied into
each other) and as vLLM does for string-content templates (a list of content
parts becomes its text parts joined by newlines).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from headcount.tokens.errors import ChatTemplateError

__all__ = ["ChatTemplate", "text_of_parts"]

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
"""transformers' marker for the end of the message to continue."""
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplate:
    """One compiled chat template: `render` is `apply_chat_template(tokenize=False)`."""

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._template = _compile(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from None

    def render(
        self,
        messages: Sequence[object],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        tools: Sequence[object] | None = None,
        variables: Mapping[str, object] | None = None,
    ) -> str:
        """The text of `messages`; `variables` (special tokens, then chat_template_kwargs)
        are visible to the template."""
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt cannot both be set"
            )
        chat = [_prepared(message) for message in messages]
        if not chat:
            raise ChatTemplateError("a chat needs at least one message")
        final = self._mark_final(chat) if continue_final_message else None
        try:
            rendered = self._template.render(
                **(variables or {}),
                messages=chat,
                tools=list(tools) if tools is not None else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None
        return rendered if final is None else _cut_at_tag(rendered, final)

    def _mark_final(self, chat: list[dict[str, Any]]) -> str:
        """Tag the last message's text, as transformers does to find where to cut."""
        final = chat[-1].get("content")
        if not isinstance(final, str):
            raise ChatTemplateError("continue_final_message: the final message has no text")
        if "content" not in self.source:
            raise ChatTemplateError("continue_final_message: the template reads no content")
        chat[-1]["content"] = final + _CONTINUE_TAG
        return final


def _cut_at_tag(rendered: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError("continue_final_message: the template dropped the final message")
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()


def text_of_parts(parts: Sequence[object]) -> str:
    """A list of content parts as a string template sees it (vLLM's "string" content
    format): its text parts, joined by newlines."""
    return "\n".join(
        part["text"]
        for part in parts
        if isinstance(part, dict) and part.get("type", "text") == "text"
        if isinstance(part.get("text"), str)
    )


def _prepared(message: object) -> dict[str, Any]:
    """One message as the template sees it: a new dict, so marking it leaves the caller's alone."""
    if not isinstance(message, dict):
        raise ChatTemplateError("every message must be an object")
    prepared = {key: value for key, value in message.items() if value is not None}
    content = prepared.get("content")
    if isinstance(content, list):
        prepared["content"] = text_of_parts(content)
    reasoning = next((prepared[key] for key in _REASONING_FIELDS if key in prepared), None)
    if reasoning is not None:
        prepared = {"thinking": reasoning, **prepared, "reasoning_content": reasoning}
    return prepared


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker): its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        rendered: str = caller()
        return rendered


class _TemplateDict:
    """`dict(...)` for templates, without attribute access to the real type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """Jinja's namespace, refusing `_`-prefixed names as transformers' does."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)
