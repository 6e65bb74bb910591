"""Proves the simulated engine's answers continue their request's text, so a resumed answer checks.

A router resuming a broken stream sends the original messages plus an assistant
message holding the text already relayed (`continue_final_message`), or the
prompt followed by it; the engine must then go on with exactly the rest of the
uninterrupted answer. Checked here on the pure functions and on the bytes the
engine's own code writes (whole answers and stream chunks); over HTTP in
tests/process/test_sim_resume.py.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from headcount.sim.engine.parsing import Generation, Kind, parse_generation
from headcount.sim.engine.responses import completion_body, stream_head
from headcount.sim.engine.tokens import (
    VOCABULARY,
    answer,
    answer_text,
    context_of,
    output_ids,
    request_context,
    split,
)
from headcount.sim.engine.wire import RequestError
from headcount.tokens import builtin_tokenizer

__all__: list[str] = []

TOKENS = 24
MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Tell me how a router resumes a stream."},
]
PROMPT = "Once upon a time, a router"


def resumed_chat(messages: list[dict[str, Any]], relayed: str) -> dict[str, Any]:
    """The request a router resumes a chat with, after relaying `relayed`."""
    return {
        "messages": [*messages, {"role": "assistant", "content": relayed}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }


def parsed(body: dict[str, Any], kind: Kind) -> Generation:
    raw = json.dumps({"model": "m", **body}).encode()
    return parse_generation(raw, kind, "m", frozenset({"m"}), builtin_tokenizer())


def streamed_text(generation: Generation) -> str:
    """The text of the stream the engine's code writes for `generation`."""
    _, frames = stream_head(generation, "1", "engine-a")
    events = frames.all_chunks(generation.max_tokens).split(b"\n\n")[:-1]
    choices = [json.loads(event.removeprefix(b"data: "))["choices"][0] for event in events]
    field = "text" if generation.kind == "completion" else None
    return "".join(c[field] if field else c["delta"]["content"] for c in choices)


def whole_text(generation: Generation) -> str:
    body = json.loads(json.dumps(completion_body(generation, "1", "engine-a", None)))
    (choice,) = body["choices"]
    return str(choice["text"] if generation.kind == "completion" else choice["message"]["content"])


def test_the_vocabulary_is_words_with_one_leading_space_and_two_marks() -> None:
    assert 36 <= len(set(VOCABULARY)) == len(VOCABULARY) <= 44
    assert all(re.fullmatch(r" \w+|[,.]", token) for token in VOCABULARY)
    assert {",", "."} <= set(VOCABULARY)
    assert split("".join(VOCABULARY)) == list(VOCABULARY)


def test_an_answer_splits_back_into_exactly_its_tokens() -> None:
    text = answer_text({"messages": MESSAGES}, "chat", 200)
    tokens = split(text)
    assert len(tokens) == 200 and all(token in VOCABULARY for token in tokens)
    assert "".join(tokens) == text
    assert not re.search(r"[,.][,.]", text)  # no punctuation after punctuation
    assert all(a != b for a, b in itertools.pairwise(tokens))  # no stutter


@pytest.mark.parametrize("k", [1, 2, 7, TOKENS // 2, TOKENS - 1])
def test_a_chat_resumed_after_k_tokens_goes_on_with_the_rest(k: int) -> None:
    tokens = split(answer_text({"messages": MESSAGES}, "chat", TOKENS))
    resumed = resumed_chat(MESSAGES, "".join(tokens[:k]))
    assert answer_text(resumed, "chat", TOKENS - k) == "".join(tokens[k:])
    # and as the engine parses the request and writes its answer, streamed or whole
    generation = parsed({**resumed, "max_tokens": TOKENS - k, "stream": True}, "chat")
    assert streamed_text(generation) == whole_text(generation) == "".join(tokens[k:])


@pytest.mark.parametrize("k", [1, 2, 7, TOKENS // 2, TOKENS - 1])
def test_a_completion_resumed_after_k_tokens_goes_on_with_the_rest(k: int) -> None:
    tokens = split(answer_text({"prompt": PROMPT}, "completion", TOKENS))
    resumed = {"prompt": PROMPT + "".join(tokens[:k])}
    assert answer_text(resumed, "completion", TOKENS - k) == "".join(tokens[k:])
    generation = parsed({**resumed, "max_tokens": TOKENS - k}, "completion")
    assert streamed_text(generation) == whole_text(generation) == "".join(tokens[k:])


def test_the_engine_answers_a_request_with_its_answer_text() -> None:
    requests: list[tuple[dict[str, Any], Kind]] = [
        ({"messages": MESSAGES}, "chat"),
        ({"prompt": PROMPT}, "completion"),
    ]
    for body, kind in requests:
        generation = parsed({**body, "max_tokens": 9}, kind)
        assert streamed_text(generation) == whole_text(generation) == answer_text(body, kind, 9)


def test_different_prompts_get_different_answers() -> None:
    prompts = ["say hi", "say hello", "Once upon a time", "SELECT 1", "x", "What is 2+2?"]
    chats = {
        answer_text({"messages": [{"role": "user", "content": p}]}, "chat", 8) for p in prompts
    }
    completions = {answer_text({"prompt": p}, "completion", 8) for p in prompts}
    assert len(chats) == len(completions) == len(prompts)
    assert answer_text({"prompt": [1, 2, 3]}, "completion", 8) != answer_text(
        {"prompt": [1, 2, 4]}, "completion", 8
    )


def test_a_shorter_answer_is_the_start_of_a_longer_one() -> None:
    body = {"messages": MESSAGES}
    assert answer_text(body, "chat", 40).startswith(answer_text(body, "chat", 13))


def test_content_parts_count_as_their_text_joined_by_newlines() -> None:
    parts = [
        {"type": "text", "text": "Tell me how"},
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}},
        {"type": "text", "text": "a router resumes"},
    ]
    as_parts = {"messages": [{"role": "user", "content": parts}]}
    as_string = {"messages": [{"role": "user", "content": "Tell me how\na router resumes"}]}
    assert request_context(as_parts, "chat") == request_context(as_string, "chat")


def test_each_message_is_split_alone_and_messages_without_text_count_for_nothing() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "one two"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "user", "content": "three"},
    ]
    assert request_context({"messages": messages}, "chat") == ("one", "two", "three")
    assert request_context({"prompt": "x"}, "completion") == ("", "", "x")
    assert request_context({"prompt": [[7, 8, 9, 10]]}, "completion") == ("8", "9", "10")


def test_both_continuing_and_a_generation_prompt_is_a_400_as_in_vllm() -> None:
    body = {**resumed_chat(MESSAGES, " the router"), "add_generation_prompt": True}
    with pytest.raises(RequestError) as refused:
        parsed(body, "chat")
    assert refused.value.status == 400


def test_the_generated_tokens_ids_are_the_answers_own() -> None:
    tokenizer = builtin_tokenizer()
    generation = parsed({"messages": MESSAGES, "max_tokens": 12}, "chat")
    ids = output_ids(tokenizer, generation.context, 12)
    assert list(ids) == tokenizer.encode(whole_text(generation), add_special_tokens=False)
    other = parsed({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}, "chat")
    assert output_ids(tokenizer, other.context, 12) != ids


_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=700)


@given(prompt=_TEXT, k=st.integers(1, 11))
def test_any_prompt_resumes_after_any_k(prompt: str, k: int) -> None:
    tokens = split(answer_text({"prompt": prompt}, "completion", 12))
    resumed = {"prompt": prompt + "".join(tokens[:k])}
    assert answer_text(resumed, "completion", 12 - k) == "".join(tokens[k:])
    chat = [{"role": "user", "content": prompt}]
    tokens = split(answer_text({"messages": chat}, "chat", 12))
    assert answer_text(resumed_chat(chat, "".join(tokens[:k])), "chat", 12 - k) == "".join(
        tokens[k:]
    )


_PIECES = st.lists(
    st.text("ab", min_size=1, max_size=300) | st.sampled_from([" ", "  ", ",", "\n", "é"]),
    max_size=12,
)


@given(text=_PIECES.map("".join))
@example(text="a" * 300 + " b c")  # the search from the end starts inside the first
@example(text="x " + "é" * 299 + ", b")
def test_a_long_texts_context_is_read_from_its_end_as_from_its_start(text: str) -> None:
    """Long words, so the last few characters searched first may start inside one."""
    whole = [token.removeprefix(" ") for token in split(text)]
    assert context_of([text]) == tuple(["", "", "", *whole][-3:])
    assert answer(context_of([text]), 3) == answer(context_of(["", text]), 3)
