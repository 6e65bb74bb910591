"""Finding a model's tokenizer: a Hugging Face tokenizer directory, or the built-in one.

A directory must hold `tokenizer.json`; its chat template comes from
`chat_template.jinja` (and `additional_chat_templates/*.jinja`) when present,
as transformers prefers them, else from `chat_template` in
`tokenizer_config.json` (a string, or a list of named templates). The special
tokens' strings (bos, eos, unk, sep, pad, cls, mask; plain or as an AddedToken
object) come from `tokenizer_config.json`, then `special_tokens_map.json`. A
model with no chat template gets the built-in ChatML one (vLLM would refuse
its chats instead).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from headcount.tokens.builtin import CHATML_TEMPLATE, BuiltinVocabulary
from headcount.tokens.chat import SEGMENT_CACHE_BYTES, ChatTokenizer
from headcount.tokens.errors import TokenizerError
from headcount.tokens.vocabulary import HfVocabulary

__all__ = ["builtin_tokenizer", "load_tokenizer"]

_SPECIAL_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def builtin_tokenizer(cache_bytes: int = SEGMENT_CACHE_BYTES) -> ChatTokenizer:
    """The built-in tokenizer with the ChatML template (`headcount.tokens.builtin`), one per
    bound on its cache."""
    return _builtin(cache_bytes)


@functools.cache
def _builtin(cache_bytes: int) -> ChatTokenizer:
    return ChatTokenizer(
        BuiltinVocabulary(),
        {"default": CHATML_TEMPLATE},
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        name="builtin",
        cache_bytes=cache_bytes,
    )


def load_tokenizer(
    directory: str | Path | None, cache_bytes: int = SEGMENT_CACHE_BYTES
) -> ChatTokenizer:
    """The tokenizer in `directory`, or the built-in one for None, keeping at most
    `cache_bytes` of encoded text; reads files, so call it off the event loop."""
    if directory is None:
        return builtin_tokenizer(cache_bytes)
    root = Path(directory)
    try:
        spec = (root / "tokenizer.json").read_text(encoding="utf-8")
        config = _json_object(root / "tokenizer_config.json")
        special_map = _json_object(root / "special_tokens_map.json")
        templates = _templates(root, config)
        vocabulary = HfVocabulary(spec)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise TokenizerError(f"cannot load the tokenizer in {root}: {exc}") from None
    special = {
        name: text
        for name in _SPECIAL_NAMES
        if (text := _token_text(config.get(name, special_map.get(name)))) is not None
    }
    return ChatTokenizer(vocabulary, templates, special, name=str(root), cache_bytes=cache_bytes)


def _json_object(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return value


def _templates(root: Path, config: dict[str, Any]) -> dict[str, str]:
    templates: dict[str, str] = {}
    single = root / "chat_template.jinja"
    if single.exists():
        templates["default"] = single.read_text(encoding="utf-8")
    extra = root / "additional_chat_templates"
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            templates[path.stem] = path.read_text(encoding="utf-8")
    if templates:
        return templates if "default" in templates else {**templates, "default": CHATML_TEMPLATE}
    configured = config.get("chat_template")
    if isinstance(configured, str):
        return {"default": configured}
    if isinstance(configured, list):
        named = {str(item["name"]): str(item["template"]) for item in configured}
        return named if "default" in named else {**named, "default": CHATML_TEMPLATE}
    return {"default": CHATML_TEMPLATE}


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
