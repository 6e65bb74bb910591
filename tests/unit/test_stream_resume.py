"""Resume's pure parts: what a transcript read back, the continuation asked, the seam's events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from headcount.proxy.resume import Seam, continuation
from headcount.proxy.transcript import Relayed, Transcript, read_events


def event(fields: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(fields, separators=(",", ":")).encode() + b"\n\n"


def chat_chunk(content: str | None = None, **extra: Any) -> bytes:
    delta: dict[str, Any] = {} if content is None else {"content": content}
    delta.update(extra.pop("delta", {}))
    choice = {"index": 0, "delta": delta, "finish_reason": extra.pop("finish_reason", None)}
    return event({"id": "chatcmpl-1", "created": 5, "model": "m", "choices": [choice], **extra})


def relayed(*chunks: bytes) -> Relayed:
    transcript = Transcript()
    for chunk in chunks:
        transcript.relay(chunk)
    return transcript.relayed()


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


def test_a_transcript_relays_whole_events_only_and_holds_the_rest() -> None:
    transcript = Transcript()
    one, two = chat_chunk(" one"), chat_chunk(" two")
    assert transcript.relay(one + two[:20]) == one
    assert transcript.relay(two[20:]) == two
    assert transcript.relay(b"data: [DONE]\r\n\r\ndata: {") == b"data: [DONE]\r\n\r\n"
    assert transcript.rest() == b"data: {"
    read = transcript.relayed()
    assert (read.text, read.tokens, read.done) == ([" one", " two"], 2, True)
    assert read.ids == {"id": "chatcmpl-1", "created": 5, "model": "m"}


def test_a_long_stream_is_folded_into_its_text_as_it_goes() -> None:
    transcript = Transcript()
    for index in range(1000):
        transcript.relay(chat_chunk(f" w{index}"))
    assert transcript._size < 64 * 1024 + 200  # folded, not kept
    read = transcript.relayed()
    assert read.tokens == 1000
    assert "".join(read.text) == "".join(f" w{index}" for index in range(1000))
    assert read.frame is not None  # the folds after the first read by the frame


def test_an_event_too_long_to_hold_breaks_the_transcript() -> None:
    transcript = Transcript()
    huge = b"data: " + b"x" * (1024 * 1024 + 10)
    assert transcript.relay(huge) == huge  # forwarded as it came
    assert transcript.broken


def test_the_engines_own_token_count_wins_over_the_chunks() -> None:
    usage = {"prompt_tokens": 4, "total_tokens": 9, "completion_tokens": 5}
    assert relayed(chat_chunk(" a b", usage=usage)).completion_tokens == 5
    assert relayed(chat_chunk(" a"), chat_chunk(" b")).completion_tokens == 2


def test_a_chat_continues_from_an_assistant_message_with_the_limits_reduced() -> None:
    body = {**CHAT, "max_completion_tokens": 8, "min_tokens": 3}
    asked = json.loads(continuation("chat", body, relayed(chat_chunk(" one"), chat_chunk(" two"))))
    assert asked["messages"][-1] == {"role": "assistant", "content": " one two"}
    assert (asked["continue_final_message"], asked["add_generation_prompt"]) == (True, False)
    assert (asked["max_tokens"], asked["max_completion_tokens"], asked["min_tokens"]) == (8, 6, 1)


def test_a_chat_that_continued_its_own_assistant_message_gets_the_text_appended() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}]
    body = {**CHAT, "messages": messages, "continue_final_message": True}
    asked = json.loads(continuation("chat", body, relayed(chat_chunk(" here"))))
    assert asked["messages"] == [messages[0], {"role": "assistant", "content": "Sure, here"}]


def test_a_chat_with_nothing_relayed_is_asked_again_as_it_was() -> None:
    asked = json.loads(continuation("chat", CHAT, relayed(chat_chunk("", delta={"role": "a"}))))
    assert asked == CHAT


def test_a_completion_without_a_limit_gets_vllms_default_less_what_was_relayed() -> None:
    body = {"model": "m", "prompt": "Say"}
    chunk = event({"id": "cmpl-1", "choices": [{"index": 0, "text": " hi", "finish_reason": None}]})
    asked = json.loads(continuation("completion", body, relayed(chunk)))
    assert (asked["prompt"], asked["max_tokens"]) == ("Say hi", 15)


@pytest.mark.parametrize(
    ("changes", "chunks", "reason"),
    [
        ({"guided_json": {}}, [], "structured_output"),
        ({"response_format": {"type": "json_object"}}, [], "structured_output"),
        ({"echo": True}, [], "echo"),
        ({"messages": "hi"}, [], "prompt"),
        ({}, [chat_chunk(delta={"reasoning_content": "hmm"})], "reasoning"),
        ({}, [b"data: {not json\n\n"], "unreadable"),
        ({}, [chat_chunk(" a"), b"data: [DONE]\n\n"], "finished"),
        ({"max_tokens": 1}, [chat_chunk(" a")], "finished"),
    ],
)
def test_what_cannot_be_resumed_exactly_is_refused(
    changes: dict[str, Any], chunks: list[bytes], reason: str
) -> None:
    assert continuation("chat", {**CHAT, **changes}, relayed(*chunks)) == reason


def test_the_seam_makes_the_continuation_the_first_answer() -> None:
    ids = {"id": "chatcmpl-1", "created": 5, "model": "m"}
    seam = Seam(ids, carried=3)
    other = {"id": "chatcmpl-9", "created": 7, "model": "m", "system_fingerprint": "fp-9"}
    role = event(
        {**other, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    )
    token = event({**other, "choices": [{"index": 0, "delta": {"role": "x", "content": " b"}}]})
    usage = {"prompt_tokens": 12, "total_tokens": 14, "completion_tokens": 2}
    last = event({**other, "choices": [], "usage": usage})
    data = role + token + last + b"data: [DONE]\n\n"
    out = seam.rewrite(data[:50]) + seam.rewrite(data[50:]) + seam.rest()
    events = [json.loads(e[6:]) for e in out.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert events == [
        {**ids, "choices": [{"index": 0, "delta": {"content": " b"}}]},
        {
            **ids,
            "choices": [],
            "usage": {"prompt_tokens": 9, "total_tokens": 14, "completion_tokens": 5},
        },
    ]
    assert out.endswith(b"data: [DONE]\n\n")


def vllm_chunk(choice: str) -> bytes:
    head = b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m",'
    return b"data: " + head + b'"choices":[' + choice.encode() + b"]}\n\n"


def test_vllms_plain_chunks_are_read_as_a_json_parse_reads_them() -> None:
    plain = '{"index":0,"delta":{"content":%s},"logprobs":null,"finish_reason":null}'
    texts = [" one", ' "quoted" \\ back\nslash', "é ✓ 😀", ""]
    chunks = [vllm_chunk(plain % json.dumps(text)) for text in texts]
    chunks.append(vllm_chunk('{"index":0,"text":" t","logprobs":null,"finish_reason":null}'))
    last = '{"index":0,"delta":{"content":" z"},"logprobs":null,"finish_reason":"stop"}'
    read = relayed(*chunks, vllm_chunk(last))
    assert read.text == [*texts[:3], " t", " z"]
    assert (read.tokens, read.finished) == (5, True)
    calls = '{"index":0,"delta":{"tool_calls":[{"index":0}]},"logprobs":null,"finish_reason":null}'
    assert relayed(chunks[0], vllm_chunk(calls)).tool_call


def test_after_one_plain_chunk_the_streams_frame_reads_the_others_without_a_parse() -> None:
    plain = '{"index":0,"delta":{"content":%s},"logprobs":null,"finish_reason":null}'
    chunks = [vllm_chunk(plain % json.dumps(word)) for word in (" one", " two", " three")]
    read = relayed(*chunks)
    assert read.frame is not None
    before, after = read.frame
    assert chunks[1] == before + b" two" + after + b"\n\n"
    assert ("".join(read.text), read.tokens) == (" one two three", 3)
    # An event in the frame whose middle is no plain text is parsed, not sliced.
    odd = before + b'a","role":"x' + after + b"\n\n"
    assert "".join(relayed(*chunks, odd).text) == " one two threea"


def test_a_fold_with_one_event_out_of_the_frame_is_read_event_by_event() -> None:
    plain = '{"index":0,"delta":{"content":%s},"logprobs":null,"finish_reason":null}'
    chunks = [vllm_chunk(plain % json.dumps(word)) for word in (" one", " two", " three")]
    read = relayed(chunks[0])
    odd = vllm_chunk(plain % json.dumps(' "q"'))  # in the frame, but its text has quotes
    done = vllm_chunk('{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop"}')
    read_events(read, chunks[1] + odd + chunks[2])
    assert "".join(read.text) == ' one two "q" three'
    empty = vllm_chunk(plain % json.dumps(""))  # in the frame, no token
    read_events(read, chunks[1] + empty + chunks[2])
    assert read.tokens == 6
    read_events(read, chunks[1] + done)
    assert "".join(read.text) == ' one two "q" three two three two'
    assert (read.tokens, read.finished) == (7, True)
