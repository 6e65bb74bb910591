"""Token accounting's pure half: asking a stream for usage, and reading (and dropping) it.

Streams are built as vLLM's OpenAI server writes them (`serving_chat.py`,
`serving_completion.py`: pydantic's compact JSON, one `data: ...\\n\\n` per
chunk, the usage chunk with `choices: []` before `data: [DONE]`, an error as
one `{"error": ...}` event and no usage after it) and as the simulated engine
writes them, then cut at every byte (or many seeded places) on the way in.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from headcount.proxy import usage as usage_module
from headcount.proxy.usage import UsageTap, ask_usage, client_asks_usage
from headcount.sim.engine.parsing import Generation
from headcount.sim.engine.responses import completion_body, stream_head, usage_json

__all__: list[str] = []

PROMPT, COMPLETION = 37, 20
ANSWER_ABOUT_USAGE = 'Use {"usage":{"prompt_tokens":1}} — see "usage": {…}, naïve ✓'
"""A model answering about JSON usage: the marker's words inside content, escaped there."""


def _json(value: object) -> str:
    """pydantic's `model_dump_json`: compact, non-ASCII as UTF-8."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, object]:
    usage: dict[str, object] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _event(chunk: object, newline: str = "\n") -> bytes:
    return f"data: {_json(chunk)}{newline}{newline}".encode()


def vllm_chat_stream(
    tokens: int = COMPLETION,
    *,
    include_usage: bool = True,
    continuous: bool = False,
    newline: str = "\n",
    error_at: int | None = None,
    content: str = "tok",
) -> tuple[list[bytes], bytes | None]:
    """vLLM's chat events in order (the `[DONE]` last) and the usage event among them."""
    head = {
        "id": "chatcmpl-9f3c",
        "object": "chat.completion.chunk",
        "created": 1764600000,
        "model": "m",
    }
    events: list[bytes] = []
    first: dict[str, Any] = {
        **head,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    if continuous:
        first["usage"] = _usage(PROMPT, 0)
    events.append(_event(first, newline))
    usage_event = None
    for index in range(tokens):
        if index == error_at:
            error = {"error": {"message": "boom", "type": "BadRequestError", "code": 400}}
            events.append(_event(error, newline))
            break
        last = index == tokens - 1
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": f"{content}{index} "},
            "logprobs": None,
            "finish_reason": "length" if last else None,
        }
        if last:
            choice["stop_reason"] = None
        chunk: dict[str, Any] = {**head, "choices": [choice]}
        if continuous:
            chunk["usage"] = _usage(PROMPT, index + 1)
        events.append(_event(chunk, newline))
    else:
        if include_usage:
            usage_event = _event(
                {**head, "choices": [], "usage": _usage(PROMPT, tokens, cached=16)}, newline
            )
            events.append(usage_event)
    events.append(f"data: [DONE]{newline}{newline}".encode())
    return events, usage_event


def vllm_completion_stream(tokens: int = COMPLETION) -> tuple[list[bytes], bytes]:
    """vLLM's `/v1/completions` stream: every chunk carries `"usage":null` (exclude_unset=False),
    logprobs name tokens as keys, one of them `usage`."""
    head = {"id": "cmpl-1a2b", "object": "text_completion", "created": 1764600000, "model": "m"}
    events = []
    for index in range(tokens):
        logprobs = {
            "text_offset": [index],
            "token_logprobs": [-0.25],
            "tokens": ["usage"],
            "top_logprobs": [{"usage": -0.25, "use": -2.5}],
        }
        choice = {
            "index": 0,
            "text": "usage" if index % 2 else ' "usage":{}',
            "logprobs": logprobs,
            "finish_reason": "length" if index == tokens - 1 else None,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": None,
        }
        events.append(_event({**head, "choices": [choice], "usage": None}))
    usage_event = _event({**head, "choices": [], "usage": _usage(PROMPT, tokens)})
    return [*events, usage_event, b"data: [DONE]\n\n"], usage_event


def sim_chat_stream(tokens: int = COMPLETION) -> tuple[bytes, bytes]:
    """The simulated engine's stream, built by its own code: the whole, and its usage event."""
    generation = Generation("chat", "m", True, tokens, True, list(range(PROMPT)))
    head, frames = stream_head(generation, "abc", "engine-a")
    usage_event = head + b'"choices":[],"usage":' + usage_json(generation, 8)
    return frames.all_chunks(tokens) + usage_event + b"data: [DONE]\n\n", usage_event


def pieces_at(body: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


def splits(body: bytes, seed: int, count: int) -> Iterator[list[bytes]]:
    """Every cut in two, one byte a piece, then `count` seeded cuts in up to 12 pieces."""
    for at in range(len(body) + 1):
        yield pieces_at(body, [at])
    yield [body[i : i + 1] for i in range(len(body))]
    rng = random.Random(seed)
    for _ in range(count):
        yield pieces_at(body, rng.sample(range(1, len(body)), rng.randint(2, 11)))


def run(tap: UsageTap, pieces: list[bytes]) -> bytes:
    return b"".join([*(tap.feed(piece) for piece in pieces), tap.end()])


# -- asking -----------------------------------------------------------------------------------


def test_a_stream_that_does_not_ask_is_asked_compactly_with_its_other_options_kept() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "naïve ✓"}],
        "stream": True,
        "stream_options": {"include_usage": False, "extra": 1},
    }
    asked = ask_usage(body)
    assert asked is not None
    assert asked == _json({**body, "stream_options": {"include_usage": True, "extra": 1}}).encode()
    assert "naïve ✓".encode() in asked and b": " not in asked
    assert body["stream_options"] == {"include_usage": False, "extra": 1}  # not changed in place
    assert client_asks_usage(json.loads(asked)) and not client_asks_usage(body)


@pytest.mark.parametrize("options", [None, "absent"])
def test_a_stream_without_options_gets_include_usage(options: object) -> None:
    body: dict[str, Any] = {"model": "m", "prompt": "x", "stream": True}
    if options != "absent":
        body["stream_options"] = options
    asked = ask_usage(body)
    assert asked is not None
    assert json.loads(asked) == {**body, "stream_options": {"include_usage": True}}
    assert not client_asks_usage(body)


def test_turning_usage_on_keeps_continuous_stats_off_as_the_client_had_them() -> None:
    # vLLM reads continuous_usage_stats only with include_usage: on, they would add
    # usage to every chunk the client sees.
    body = {
        "stream": True,
        "stream_options": {"continuous_usage_stats": True, "include_usage": None},
    }
    asked = ask_usage(body)
    assert asked is not None
    assert json.loads(asked)["stream_options"] == {
        "continuous_usage_stats": False,
        "include_usage": True,
    }


@pytest.mark.parametrize(
    "body",
    [
        {"stream": False, "stream_options": {"include_usage": False}},
        {"messages": []},
        {"stream": "true"},  # vLLM reads it, the router does not touch it
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream": True, "stream_options": {}},  # vLLM's default: include_usage true
        {"stream": True, "stream_options": {"continuous_usage_stats": True}},
        {"stream": True, "stream_options": {"include_usage": "yes"}},  # the engine decides
        {"stream": True, "stream_options": ["include_usage"]},  # the engine refuses it
    ],
)
def test_nothing_changes_for_bodies_that_ask_are_not_streams_or_are_the_engines_to_judge(
    body: dict[str, Any],
) -> None:
    assert ask_usage(body) is None


def test_the_client_asks_as_vllm_reads_stream_options() -> None:
    assert client_asks_usage({"stream_options": {}})
    assert client_asks_usage({"stream_options": {"include_usage": True}})
    assert not client_asks_usage({"stream_options": {"include_usage": False}})
    assert not client_asks_usage({"stream_options": None})
    assert not client_asks_usage({})


# -- streams, dropping the usage event ----------------------------------------------------------


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_dropping_forwards_the_stream_minus_exactly_its_usage_event_however_cut(
    newline: str,
) -> None:
    events, usage_event = vllm_chat_stream(newline=newline, content=ANSWER_ABOUT_USAGE)
    assert usage_event is not None
    body = b"".join(events)
    expected = body.replace(usage_event, b"")
    assert len(expected) == len(body) - len(usage_event)
    boundary = (newline * 2).encode()
    for pieces in splits(body, seed=18, count=300):
        tap = UsageTap(event_stream=True, drop_usage=True)
        forwarded = tap.feed(pieces[0])
        # held back: only what follows the last whole event
        whole = (
            pieces[0][: pieces[0].rfind(boundary) + len(boundary)] if boundary in pieces[0] else b""
        )
        assert forwarded == whole.replace(usage_event, b"")
        assert forwarded + run(tap, pieces[1:]) == expected
        assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)


def test_the_done_event_in_the_usage_events_piece_is_forwarded_at_once() -> None:
    events, _ = vllm_chat_stream()
    tap = UsageTap(event_stream=True, drop_usage=True)
    assert b"".join(tap.feed(event) for event in events[:-2]) == b"".join(events[:-2])
    assert tap.feed(events[-2] + events[-1]) == b"data: [DONE]\n\n"
    assert tap.end() == b""
    assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)


def test_the_simulated_engines_usage_event_is_dropped_however_cut() -> None:
    body, usage_event = sim_chat_stream()
    expected = body.replace(usage_event, b"")
    assert len(expected) == len(body) - len(usage_event)
    for pieces in splits(body, seed=5, count=100):
        tap = UsageTap(event_stream=True, drop_usage=True)
        assert run(tap, pieces) == expected
        assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)


def test_completion_chunks_with_null_usage_and_usage_tokens_are_forwarded_whole() -> None:
    events, usage_event = vllm_completion_stream()
    body = b"".join(events)
    expected = body.replace(usage_event, b"")
    for pieces in splits(body, seed=7, count=100):
        tap = UsageTap(event_stream=True, drop_usage=True)
        assert run(tap, pieces) == expected
        assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)


def test_an_error_mid_stream_is_forwarded_and_leaves_no_numbers() -> None:
    events, usage_event = vllm_chat_stream(error_at=7)
    assert usage_event is None and b'"error"' in events[-2]
    body = b"".join(events)
    for pieces in splits(body, seed=3, count=50):
        tap = UsageTap(event_stream=True, drop_usage=True)
        assert run(tap, pieces) == body
        assert (tap.prompt_tokens, tap.completion_tokens) == (None, None)


def test_a_stream_cut_before_its_usage_event_forwards_all_it_had_and_has_no_numbers() -> None:
    events, _ = vllm_chat_stream()
    body = b"".join(events[:-2])
    cut_in_a_chunk = body + events[-3][:40]
    for sent in (body, cut_in_a_chunk):
        tap = UsageTap(event_stream=True, drop_usage=True)
        assert run(tap, [sent]) == sent
        assert (tap.prompt_tokens, tap.completion_tokens) == (None, None)


@pytest.mark.parametrize("after_choices", [12, 30, None], ids=["choices", "usage", "no-blank"])
def test_a_usage_event_cut_or_without_its_blank_line_is_not_forwarded(
    after_choices: int | None,
) -> None:
    events, usage_event = vllm_chat_stream()
    assert usage_event is not None
    kept = -2 if after_choices is None else usage_event.index(b'"choices":[]') + after_choices
    before = b"".join(events[:-2])
    tap = UsageTap(event_stream=True, drop_usage=True)
    assert run(tap, [before, usage_event[:kept]]) == before
    numbers = (PROMPT, COMPLETION) if after_choices is None else (None, None)
    assert (tap.prompt_tokens, tap.completion_tokens) == numbers


def test_an_event_cut_before_it_shows_its_choices_is_forwarded_as_any_chunk_would_be() -> None:
    events, usage_event = vllm_chat_stream()
    assert usage_event is not None
    sent = b"".join(events[:-2]) + usage_event[:60]
    assert run(UsageTap(event_stream=True, drop_usage=True), [sent]) == sent


def test_a_continuous_usage_stream_keeps_its_chunks_drops_the_usage_event_final_numbers_win() -> (
    None
):
    # An engine started with --enable-force-include-usage sends both, asked or not.
    events, usage_event = vllm_chat_stream(continuous=True)
    assert usage_event is not None
    body = b"".join(events)
    for pieces in splits(body, seed=11, count=100):
        tap = UsageTap(event_stream=True, drop_usage=True)
        assert run(tap, pieces) == body.replace(usage_event, b"")
        assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)


class CountingDecoder(json.JSONDecoder):
    """A decoder that counts what it is asked to parse."""

    def __init__(self) -> None:
        super().__init__()
        self.parsed: list[str] = []

    def raw_decode(self, s: str, idx: int = 0) -> tuple[Any, int]:
        self.parsed.append(s)
        return super().raw_decode(s, idx)


@pytest.mark.parametrize("drop", [True, False], ids=["dropping", "forwarding"])
def test_vllms_usage_is_read_without_a_json_parse_and_others_with_one_of_the_object_only(
    drop: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoder = CountingDecoder()
    monkeypatch.setattr(usage_module, "_DECODER", decoder)
    events, usage_event = vllm_chat_stream(content=ANSWER_ABOUT_USAGE)
    assert usage_event is not None
    vllm_usage = b'"usage":{"prompt_tokens":37,"total_tokens":57,"completion_tokens":20,'
    openai_usage = b'"usage":{"prompt_tokens":37,"completion_tokens":20,"total_tokens":57,'
    assert vllm_usage in usage_event
    for usage, parses in ((vllm_usage, 0), (openai_usage, 1)):
        decoder.parsed.clear()
        tap = UsageTap(event_stream=True, drop_usage=drop)
        sent = [event.replace(vllm_usage, usage) for event in events]
        forwarded = b"".join([*(tap.feed(event) for event in sent), tap.end()])
        assert forwarded == b"".join(sent if not drop else [*sent[:-2], sent[-1]])
        assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)
        assert len(decoder.parsed) == parses
        assert all(len(text) <= usage_module._USAGE_SPAN for text in decoder.parsed)


def test_forwarding_keeps_a_bounded_tail_of_a_long_answer() -> None:
    body = _chat_completion("x" * 1_000_000, {"prompt_logprobs": None})
    tap = UsageTap(event_stream=False)
    most = 0
    for at in range(0, len(body), 1000):
        tap.feed(body[at : at + 1000])
        most = max(most, sum(map(len, tap._window)))
    assert most <= 2 * usage_module._WINDOW + 1000
    assert tap.end() == b"" and (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)


def test_an_endless_event_is_held_back_no_further_than_the_bound() -> None:
    tap = UsageTap(event_stream=True, drop_usage=True)
    piece = b"x" * 1024
    forwarded = [tap.feed(b"data: {" if i == 0 else piece) for i in range(100)]
    held = 7 + 99 * 1024 - sum(map(len, forwarded))
    assert 0 <= held <= usage_module._MAX_HELD
    assert b"".join(forwarded) + tap.end() == b"data: {" + piece * 99


# -- forwarding unchanged ------------------------------------------------------------------------


@pytest.mark.parametrize("continuous", [False, True], ids=["final", "continuous"])
def test_a_stream_that_asked_goes_through_unchanged_piece_by_piece(continuous: bool) -> None:
    events, _ = vllm_chat_stream(continuous=continuous, content=ANSWER_ABOUT_USAGE)
    body = b"".join(events)
    for pieces in splits(body, seed=2, count=100):
        tap = UsageTap(event_stream=True)
        assert all(tap.feed(piece) is piece for piece in pieces)
        assert tap.end() == b""
        assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)


def test_a_cut_stream_that_asked_has_the_last_whole_numbers_it_carried() -> None:
    events, _ = vllm_chat_stream(continuous=True)
    tap = UsageTap(event_stream=True)
    run(tap, [b"".join(events[:5]), events[5][:-30]])  # chunk 5's usage cut short
    assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, 4)


def _prompt_logprobs(tokens: int) -> list[object]:
    """vLLM's `prompt_logprobs`: one object per prompt token, keyed by token id."""
    return [
        {str(token): {"logprob": -1.5, "rank": 1, "decoded_token": "usage"}}
        for token in range(tokens)
    ]


def _chat_completion(content: str, tail: dict[str, object]) -> bytes:
    """vLLM's non-streamed chat answer: starlette's JSONResponse, compact, usage near the end."""
    return _json(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1764600000,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content,
                        "refusal": None,
                        "tool_calls": [],
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                    "stop_reason": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": _usage(PROMPT, COMPLETION),
            **tail,
        }
    ).encode()


@pytest.mark.parametrize(
    "body",
    [
        _chat_completion(
            ANSWER_ABOUT_USAGE * 40, {"prompt_logprobs": None, "kv_transfer_params": None}
        ),
        _chat_completion(
            "ok", {"prompt_logprobs": [None, {"usage": {"logprob": -1.0, "rank": 1}}]}
        ),
        _json(
            completion_body(
                Generation("completion", "m", False, COMPLETION, False, list(range(PROMPT))),
                "1",
                "engine-a",
                None,
            )
        ).encode(),
    ],
    ids=["chat", "prompt-logprobs-after", "sim-text-completion"],
)
def test_a_whole_answer_goes_through_unchanged_and_its_usage_is_read(body: bytes) -> None:
    for pieces in splits(body, seed=len(body), count=100):
        tap = UsageTap(event_stream=False)
        assert all(tap.feed(piece) is piece for piece in pieces)
        assert tap.end() == b""
        assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)


@pytest.mark.parametrize(("tokens", "read"), [(100, True), (3000, False)])
def test_a_usage_followed_by_more_than_the_window_is_not_read(tokens: int, read: bool) -> None:
    body = _chat_completion("ok", {"prompt_logprobs": [None, *_prompt_logprobs(tokens)]})
    assert (len(body) - body.index(b'"usage":{') < usage_module._WINDOW) == read
    tap = UsageTap(event_stream=False)
    assert run(tap, [body[at : at + 1000] for at in range(0, len(body), 1000)]) == body
    numbers = (PROMPT, COMPLETION) if read else (None, None)
    assert (tap.prompt_tokens, tap.completion_tokens) == numbers


def test_embeddings_usage_reports_no_completion_beyond_zero() -> None:
    body = _json(
        {
            "id": "embd-1",
            "object": "list",
            "created": 1,
            "model": "m",
            "data": [{"index": 0, "object": "embedding", "embedding": [0.1] * 512}],
            "usage": {"prompt_tokens": 9, "total_tokens": 9, "completion_tokens": 0},
        }
    ).encode()
    tap = UsageTap.for_response(b"application/json", drop_usage=True)
    assert run(tap, pieces_at(body, [1000, 3000])) == body
    assert (tap.prompt_tokens, tap.completion_tokens) == (9, 0)


@pytest.mark.parametrize(
    "body",
    [
        b'{"error":{"message":"bad","type":"BadRequestError","code":400}}',
        b'{"object":"chat.completion","usage":{"prompt_tokens":"7","completion_tokens":-1}}',
        b'{"object":"chat.completion","usage":{"prompt_tokens":7,"completion_tok',
        b'{"object":"chat.completion","usage":[1,2]}',
        b"\xff\xfe not json at all",
        b"",
    ],
    ids=["error", "not-numbers", "cut", "not-an-object", "garbage", "empty"],
)
def test_a_missing_or_malformed_usage_leaves_the_numbers_none(body: bytes) -> None:
    for tap in (UsageTap(event_stream=False), UsageTap(event_stream=True, drop_usage=True)):
        assert run(tap, [body]) == body
        assert (tap.prompt_tokens, tap.completion_tokens) == (None, None)


def test_a_usage_with_only_one_number_keeps_it() -> None:
    tap = UsageTap(event_stream=False)
    run(tap, [b'{"usage":{"prompt_tokens":5,"completion_tokens":null}}'])
    assert (tap.prompt_tokens, tap.completion_tokens) == (5, None)


def test_an_error_answer_to_a_stream_is_json_and_never_dropped() -> None:
    body = (
        b'{"error":{"message":"x","type":"BadRequestError","code":400},"usage":{"prompt_tokens":1}}'
    )
    tap = UsageTap.for_response(b"application/json", drop_usage=True)
    assert run(tap, [body]) == body and tap.prompt_tokens == 1
    stream = UsageTap.for_response(b"text/event-stream; charset=utf-8", drop_usage=True)
    events, usage_event = vllm_chat_stream()
    assert usage_event is not None
    assert run(stream, events) == b"".join(events).replace(usage_event, b"")


def test_a_body_without_stream_options_has_the_ask_spliced_into_its_own_bytes() -> None:
    raw = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "\\u00e9"}]}'
    body = json.loads(raw)
    asked = ask_usage(body, raw)
    assert asked is not None and asked.endswith(raw[1:])
    assert json.loads(asked) == {**body, "stream_options": {"include_usage": True}}
    spaced = b" " + raw  # not a brace first: encoded again, the same meaning
    again = ask_usage(body, spaced)
    assert again is not None and json.loads(again) == json.loads(asked)
    with_options = {**body, "stream_options": None}
    encoded = ask_usage(with_options, raw)
    assert encoded is not None and json.loads(encoded)["stream_options"] == {"include_usage": True}
    assert not encoded.endswith(raw[1:])


@pytest.mark.parametrize("digits", [18, 19, 4000, 5000])
def test_a_count_of_any_length_is_read_or_left_none_never_raised(digits: int) -> None:
    nines = b"9" * digits
    body = (
        b'{"object":"chat.completion","usage":{"prompt_tokens":%s,"total_tokens":%s,'
        b'"completion_tokens":2}}' % (nines, nines)
    )
    read = (int(nines), 2) if digits < 1000 else (None, None)  # beyond `_USAGE_SPAN`: unread
    for tap in (UsageTap(event_stream=False), UsageTap(event_stream=True, drop_usage=True)):
        assert run(tap, [body]) == body
        assert (tap.prompt_tokens, tap.completion_tokens) == read


_VLLM_LAYOUT = re.compile(
    rb'\{"prompt_tokens":(\d{1,18}),"total_tokens":\d{1,18},"completion_tokens":(\d{1,18})[,}]'
)
"""vLLM's layout as a regular expression: what the fast read must agree with."""
_KEYS = (b'{"prompt_tokens":', b',"total_tokens":', b',"completion_tokens":')
_ODD = st.sampled_from([b"", b" ", b"-", b"x", b'"', b"{", b",", b"}", b"0", b"9" * 19])


@st.composite
def _usage_like(draw: st.DrawFn) -> bytes:
    """vLLM's usage, or something near it: one key, count or its end changed."""
    parts = []
    for key in _KEYS:
        parts += [key, b"7" * draw(st.integers(min_value=0, max_value=20))]
    parts.append(draw(st.sampled_from([b",", b"}"])))
    changed = draw(st.integers(min_value=0, max_value=2 * len(parts)))
    if changed < len(parts):
        parts[changed] = draw(_ODD)
    return b"".join(parts)


@given(_usage_like())
def test_vllms_layout_is_read_exactly_where_a_regular_expression_would_match(
    usage: bytes,
) -> None:
    tail = b'"usage":' + usage
    layout = _VLLM_LAYOUT.match(tail, len(b'"usage":'))
    expected = None if layout is None else (int(layout[1]), int(layout[2]))
    assert usage_module._vllm_usage(tail, len(b'"usage":')) == expected


def _blank_line_ends(data: bytes, start: int, end: int) -> list[int]:
    """Where every blank line inside `data[start:end]` ends: after `\\n\\n` or `\\n\\r\\n`."""
    return [
        at + len(line)
        for line in (b"\n\n", b"\n\r\n")
        for at in range(start, end - len(line) + 1)
        if data.startswith(line, at)
    ]


_SSE_BYTES = st.binary(max_size=24).map(lambda raw: bytes(b"\n\r:a"[byte % 4] for byte in raw))
"""Short runs of line breaks, carriage returns and text: every way blank lines can sit."""


@given(_SSE_BYTES, st.integers(min_value=0, max_value=24), st.integers(min_value=0, max_value=24))
@example(b"a\n\r\n\nb", 0, 6)  # a CRLF blank line ends before the LF one sharing its `\n`
@example(b"a\n\n\r\nb", 0, 6)
@example(b"\n\na\n", 1, 4)  # a blank line across `start` is not inside
def test_event_boundaries_are_the_last_and_first_blank_lines_by_their_definition(
    data: bytes, start: int, end: int
) -> None:
    start, end = min(start, len(data)), min(max(start, end), len(data))
    assert usage_module._after_boundary(data, start, end) == max(
        _blank_line_ends(data, start, end), default=start
    )
    assert usage_module._next_boundary(data, start) == min(
        _blank_line_ends(data, start, len(data)), default=len(data)
    )


def test_through_forwards_what_feed_and_end_would_and_counts_what_it_kept_back() -> None:
    events, usage_event = vllm_chat_stream()
    assert usage_event is not None
    body = b"".join(events)
    for pieces in splits(body, seed=11, count=50):
        tap = UsageTap(event_stream=True, drop_usage=True)
        last = len(pieces) - 1
        forwarded = b"".join(tap.through(piece, at == last) for at, piece in enumerate(pieces))
        assert forwarded == body.replace(usage_event, b"")
        assert tap.dropped == len(usage_event)
        assert (tap.prompt_tokens, tap.completion_tokens) == (PROMPT, COMPLETION)
