"""The simulated engine's request reading and stream bytes, as vLLM's OpenAI server has them.

vLLM reads `stream_options` through pydantic (`StreamOptions.include_usage`
defaults to true, `continuous_usage_stats` counts only with it, options on a
request that does not stream are a 400) and writes completion chunks with
every field (`"usage":null`), chat chunks without unset ones.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from headcount.sim.engine.parsing import Generation, parse_generation
from headcount.sim.engine.responses import stream_head
from headcount.sim.engine.wire import RequestError
from headcount.tokens import builtin_tokenizer

__all__: list[str] = []

SERVED = frozenset({"m"})


def generation(**body: Any) -> Generation:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return parse_generation(json.dumps(request).encode(), "chat", "m", SERVED, builtin_tokenizer())


@pytest.mark.parametrize(
    ("options", "include", "continuous"),
    [
        ("absent", False, False),
        (None, False, False),
        ({}, True, False),  # vLLM's default: include_usage true
        ({"include_usage": True}, True, False),
        ({"include_usage": False}, False, False),
        ({"include_usage": None}, False, False),
        ({"continuous_usage_stats": True}, True, True),
        ({"include_usage": False, "continuous_usage_stats": True}, False, False),
        ({"include_usage": True, "continuous_usage_stats": True}, True, True),
    ],
)
def test_stream_options_read_as_vllm_reads_them(
    options: object, include: bool, continuous: bool
) -> None:
    body: dict[str, Any] = {"stream": True}
    if options != "absent":
        body["stream_options"] = options
    parsed = generation(**body)
    assert (parsed.include_usage, parsed.continuous_usage) == (include, continuous)


@pytest.mark.parametrize(
    "body",
    [
        {"stream_options": {"include_usage": True}},
        {"stream": False, "stream_options": {"continuous_usage_stats": False}},
        {"stream": True, "stream_options": ["include_usage"]},
        {"stream": True, "stream_options": {"include_usage": "sometimes"}},
    ],
)
def test_stream_options_vllm_refuses_are_a_400(body: dict[str, Any]) -> None:
    with pytest.raises(RequestError) as refused:
        generation(**body)
    assert refused.value.status == 400


def test_empty_stream_options_on_a_whole_answer_pass_as_in_vllm() -> None:
    assert not generation(stream=False, stream_options={}).include_usage


def _chunks(parsed: Generation) -> list[dict[str, Any]]:
    _, frames = stream_head(parsed, "1", "engine-a")
    events = frames.all_chunks(parsed.max_tokens).split(b"\n\n")
    assert events[-1] == b""
    return [json.loads(event.removeprefix(b"data: ")) for event in events[:-1]]


def test_continuous_usage_puts_the_usage_so_far_on_every_chunk() -> None:
    parsed = generation(stream=True, max_tokens=4, stream_options={"continuous_usage_stats": True})
    chunks = _chunks(parsed)
    prompt = parsed.prompt_tokens
    assert [chunk["usage"] for chunk in chunks] == [
        {"prompt_tokens": prompt, "total_tokens": prompt + n, "completion_tokens": n}
        for n in range(1, 5)
    ]
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks] == [None] * 3 + ["length"]


def test_chat_chunks_leave_usage_out_and_completion_chunks_write_it_null() -> None:
    chat = generation(stream=True, max_tokens=3)
    assert all("usage" not in chunk for chunk in _chunks(chat))
    request = {"model": "m", "prompt": "hi", "stream": True, "max_tokens": 3}
    raw = json.dumps(request).encode()
    completion = parse_generation(raw, "completion", "m", SERVED, builtin_tokenizer())
    chunks = _chunks(completion)
    assert [chunk["usage"] for chunk in chunks] == [None] * 3
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
