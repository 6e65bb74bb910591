"""What bounds an engine's `/tokenize` answer before any is asked: the model's context length.

The requests themselves, and engines' answers, are tests/process/test_request_tokens.py.
"""

from __future__ import annotations

import dataclasses

from headcount.routing.kv.prompts import context_length
from tests.support import engine

VLLM_CARDS = (
    {"id": "m", "max_model_len": 4096},  # vLLM lists the base model first
    {"id": "m-lora", "parent": "m", "root": "/adapters/a"},  # an adapter's card has no length
    {"id": "other", "max_model_len": True},
)


def test_the_context_length_is_the_models_card_or_its_base_models() -> None:
    served = dataclasses.replace(engine("a"), cards=VLLM_CARDS)
    assert context_length(served, "m") == 4096
    assert context_length(served, "m-lora") == 4096
    assert context_length(served, "other") is None  # not a length
    assert context_length(served, "unknown") is None
    assert context_length(engine("b"), "m") is None  # an engine that reports none
