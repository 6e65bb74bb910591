"""The kv-aware wiring's own decisions: which tokenizer the router loads, and how it fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from headcount.app import load_router_tokenizer
from headcount.config import BUILTIN_TOKENIZER, ConfigError
from headcount.tokens import builtin_tokenizer


async def test_without_a_tokenizer_the_engines_tokenize() -> None:
    assert await load_router_tokenizer(None) is None


async def test_builtin_is_the_simulators_tokenizer() -> None:
    tokenizer = await load_router_tokenizer(BUILTIN_TOKENIZER)
    assert tokenizer is builtin_tokenizer()


async def test_a_broken_tokenizer_directory_fails_the_start_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError) as failure:
        await load_router_tokenizer(str(tmp_path))
    message = str(failure.value)
    assert message.startswith(f"--tokenizer {tmp_path}: cannot load the tokenizer")
    assert "\n" not in message
