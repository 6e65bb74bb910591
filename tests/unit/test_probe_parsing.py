"""Reading an engine's answers as they stream in: `/v1/models` cards and vLLM's load metrics.

The parsers are checked against plain references (`json.loads` and a line by
line reading) on generated answers split at generated points: where an answer
is split never changes what is kept, and hostile answers (deep, huge, not
JSON, not UTF-8, cut short) are rejected with a reason, never an escaping
exception.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headcount.fleet.vllm_load import MAX_LINE, LoadParser, VllmLoad, parse_vllm_load
from headcount.probe.model_list import (
    KEPT_FIELDS,
    MAX_DEPTH,
    MAX_TOKEN,
    Card,
    ModelListError,
    ModelListParser,
)

# ------------------------------------------------------------------ helpers


def pieces(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = sorted({min(max(cut, 0), len(data)) for cut in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def read_cards(
    answer: bytes, cuts: Iterable[int] = (), max_models: int = 10**6
) -> tuple[Card, ...] | str:
    """The cards kept from `answer` fed in pieces, or the error's message."""
    parser = ModelListParser(max_models)
    try:
        for piece in pieces(answer, cuts):
            parser.feed(piece)
            if parser.full:
                break
        return parser.close()
    except ModelListError as exc:
        return f"error: {exc}"


def read_load(text: bytes, cuts: Iterable[int] = ()) -> VllmLoad:
    parser = LoadParser()
    for piece in pieces(text, cuts):
        parser.feed(piece)
    return parser.close()


def gauges(load: VllmLoad) -> tuple[float, float, float | None]:
    return load.running, load.waiting, load.kv_usage


_UNCONVERTIBLE = object()


def _int_or_marker(text: str) -> object:
    try:
        return int(text)
    except ValueError:  # over int()'s digit limit: the parser drops such a field
        return _UNCONVERTIBLE


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _keepable(value: object) -> bool:
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
        return True
    return False


def reference_cards(answer: bytes, max_models: int = 10**6) -> tuple[Card, ...] | None:
    """What the parser must keep, from `json.loads` of the whole answer; None if unusable."""
    try:
        document = json.loads(
            answer.decode("utf-8"), parse_int=_int_or_marker, parse_constant=_reject_constant
        )
    except (ValueError, RecursionError):
        return None
    if _depth(document) > MAX_DEPTH:
        return None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        return None
    cards: list[Card] = []
    for item in document["data"]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        if not _keepable(item["id"]):
            continue
        cards.append({k: item[k] for k in KEPT_FIELDS if k in item and _keepable(item[k])})
        if len(cards) == max_models:
            break
    return tuple(cards) or None


def assert_same_as_reference(result: tuple[Card, ...] | str, expected: object) -> None:
    if expected is None:
        assert isinstance(result, str), f"kept {result!r} from an unusable answer"
    else:
        assert result == expected
        assert [list(card) for card in result] == [  # type: ignore[union-attr]
            [k for k in KEPT_FIELDS if k in card]
            for card in expected  # type: ignore[attr-defined]
        ], "fields in one order, whatever the engine's"


# ------------------------------------------------------------------ generated answers

_texts = st.text(
    alphabet=st.characters(blacklist_categories=()), max_size=12
)  # surrogates included: they must not survive into a card
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _texts
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_texts, inner, max_size=4),
    max_leaves=12,
)
_field_names = st.sampled_from([*KEPT_FIELDS, "permission", "id", "junk"]) | _texts
_cards = st.dictionaries(_field_names, _values, max_size=9)
_card_ids = st.none() | _texts | st.sampled_from(["m", "lora-a", "x/y"]) | _values
_items = st.builds(
    lambda card, id_: card if id_ is None else {**card, "id": id_}, _cards, _card_ids
)
_lists = st.fixed_dictionaries(
    {"data": st.lists(_items | _values, max_size=6)},
    optional={"object": _values, "extra": _values},
)
_documents = _lists | _values


@st.composite
def _answers(draw: st.DrawFn, *, utf8: bool = True) -> bytes:
    """Answers as an engine's JSON encoder may write them; with `utf8` False, lone surrogates
    may be written raw (not UTF-8), as a lax encoder would."""
    document = draw(_documents)
    ascii_only = draw(st.booleans())
    if utf8:
        try:
            json.dumps(document, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            ascii_only = True
    indent = draw(st.sampled_from([None, 0, 2]))
    separators = draw(st.sampled_from([None, (",", ":"), ("\r\n ,\t", " :\n")]))
    text = json.dumps(document, ensure_ascii=ascii_only, indent=indent, separators=separators)
    return text.encode("utf-8", "surrogatepass" if not utf8 else "strict")


_cut_points = st.lists(st.integers(min_value=0, max_value=4096), max_size=12)


@settings(max_examples=400, deadline=None)
@given(answer=_answers(), cuts=_cut_points, max_models=st.integers(1, 5) | st.just(10**6))
def test_cards_are_what_json_says_whatever_the_pieces(
    answer: bytes, cuts: list[int], max_models: int
) -> None:
    result = read_cards(answer, cuts, max_models)
    assert_same_as_reference(result, reference_cards(answer, max_models))
    assert result == read_cards(answer, (), max_models), "split or whole, the same outcome"


@st.composite
def _damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(_answers(utf8=False)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["cut", "drop", "insert", "replace"]))
        if kind == "cut":
            del data[at:]
        elif kind == "drop":
            del data[at : at + 1]
        else:
            byte = draw(st.sampled_from(b'{}[]:,"\\ 0-eE.\x00\xff\xc3tfn') | st.integers(0, 255))
            data[at : at + (kind == "replace")] = bytes([byte])
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(answer=_damaged() | _answers(utf8=False), cuts=_cut_points)
def test_a_damaged_answer_is_rejected_exactly_when_json_rejects_it(
    answer: bytes, cuts: list[int]
) -> None:
    assert_same_as_reference(read_cards(answer, cuts), reference_cards(answer))


BASE_CARD: Card = {
    "id": "m",
    "object": "model",
    "created": 1700000000,
    "owned_by": "vllm",
    "root": "m",
    "parent": None,
    "max_model_len": 8192,
}
PERMISSION = [{"id": "modelperm-1", "object": "model_permission", "allow_view": True}]


def test_cards_keep_only_the_scalar_fields_the_router_serves() -> None:
    adapter = {"id": "lora-a", "parent": "m", "root": "/adapters/a", "evil": {"nested": [1, 2]}}
    answer = {"object": "list", "data": [{**BASE_CARD, "permission": PERMISSION}, adapter]}
    assert read_cards(json.dumps(answer).encode()) == (
        {name: value for name, value in BASE_CARD.items() if name != "created"},
        {"id": "lora-a", "root": "/adapters/a", "parent": "m"},
    )


def test_a_field_that_holds_no_scalar_is_dropped_and_a_card_without_a_string_id_too() -> None:
    answer = (
        b'{"data": [{"id": "a", "root": {"x": 1}, "created": 1e999, "owned_by": "\\ud800"},'
        b' {"id": ["b"]}, {"id": 3}, "c", {"id": "\\udfff"}, {"id": "d", "parent": [null]}]}'
    )
    assert read_cards(answer) == ({"id": "a"}, {"id": "d"})


def test_of_two_equal_keys_the_last_counts_as_in_json() -> None:
    answer = b'{"data": [{"id": "a", "id": {"no": 1}}, {"id": 1, "id": "b"}], "data": 5}'
    assert read_cards(answer).startswith("error")  # type: ignore[union-attr]
    answer = b'{"data": 5, "data": [{"root": "r", "id": "a", "root": ["x"]}]}'
    assert read_cards(answer) == ({"id": "a"},)


def test_at_most_max_models_are_kept_and_the_rest_is_never_read() -> None:
    head = b'{"data": [' + b",".join(b'{"id": "m%d"}' % i for i in range(25))
    parser = ModelListParser(10)
    parser.feed(head)
    assert parser.full
    parser.feed(b" this is not JSON and never looked at")
    assert [card["id"] for card in parser.close()] == [f"m{i}" for i in range(10)]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b'{"data":' + b"[" * 100_000, f"nested deeper than {MAX_DEPTH} levels"),
        (b'{"data": [{"id": "m", "x": ' + b"[" * (MAX_DEPTH - 2), "nested deeper"),
        (b'{"data": [{"id": "' + b"m" * (MAX_TOKEN + 1) + b'"}]}', "over 65536 bytes"),
        (b'{"data": [{"id": "m", "n": ' + b"1" * (MAX_TOKEN + 1) + b"}]}", "over 65536 bytes"),
        (b'{"data": [{"id": "m", "n": 1' + b"0" * MAX_TOKEN, "over 65536 bytes"),
        (b'{"data": [{"id": "m", "n": 1' + b"e" * MAX_TOKEN, "not JSON (byte 28)"),
        (b'{"data": [{"id": "m", "n": 1.', "not JSON (byte 28)"),
        (b'{"data": [{"id": "m\xff"}]}', "not UTF-8"),
        (b'{"data": [{"id": "m\xc3', "not UTF-8"),
        (b'\xef\xbb\xbf{"data": [{"id": "m"}]}', "not JSON (byte 0)"),
        (b'{"data": [{"id": "m", "x": NaN}]}', "not JSON (byte 27)"),
        (b'{"data": [{"id": "m", "x": Infinity}]}', "not JSON"),
        (b'{"data": [{"id": "m", "x": 01}]}', "not JSON"),
        (b'{"data": [{"id": "m"},]}', "not JSON"),
        (b'{"data": [{"id": "m"}]} {}', "more after the model list"),
        (b'{"data": [{"id": "m"}]', "truncated"),
        (b'{"data": [{"id": "m', "truncated"),
        (b'{"data": [{"id": "m"}], "n": 12', "truncated"),
        (b"", "empty answer"),
        (b" \n", "empty answer"),
        (b'[{"id": "m"}]', "not an OpenAI model list"),
        (b'"data"', "not an OpenAI model list"),
        (b'{"data": {"id": "m"}}', "not an OpenAI model list"),
        (b'{"object": "list"}', "not an OpenAI model list"),
        (b'{"data": [{"no": "id"}, "x", 1]}', "lists no model"),
    ],
)
def test_an_unusable_answer_is_rejected_with_a_reason(answer: bytes, reason: str) -> None:
    for cuts in ((), range(0, len(answer), 7), range(0, len(answer), 4096)):
        result = read_cards(answer, cuts)
        assert isinstance(result, str) and reason in result, (cuts, result)


def test_nesting_up_to_the_limit_is_read() -> None:
    junk = b"[" * (MAX_DEPTH - 3) + b"]" * (MAX_DEPTH - 3)
    assert read_cards(b'{"data": [{"id": "m", "x": ' + junk + b"}]}") == ({"id": "m"},)


@pytest.mark.parametrize("where", ["skipped", "kept"])
def test_the_token_limit_is_exact_wherever_the_token_is(where: str) -> None:
    def answer(string: bytes) -> bytes:
        if where == "kept":
            return b'{"data": [{"id": "m", "root": %s}]}' % string
        return b'{"data": [{"id": "m", "x": [1, {"y": %s}, 2]}], "z": [%s]}' % (string, string)

    longest = b'"' + b"a\\n" * ((MAX_TOKEN - 2) // 3) + b"a" * ((MAX_TOKEN - 2) % 3) + b'"'
    assert len(longest) == MAX_TOKEN
    for cuts in ((), range(0, 3 * MAX_TOKEN, 4096)):
        assert not isinstance(read_cards(answer(longest), cuts), str)
        assert "over 65536 bytes" in str(read_cards(answer(longest[:-1] + b'a"'), cuts))


def test_long_and_escaped_strings_survive_any_split() -> None:
    name = 'é"\\/\n\t' + "x" * 20_000 + "\u2603\U0001f600"
    answer = json.dumps({"data": [{"id": name, "root": "r" * (MAX_TOKEN - 2)}]}).encode()
    expected = ({"id": name, "root": "r" * (MAX_TOKEN - 2)},)
    for step in (1, 3, 1000, 8192):
        assert read_cards(answer, range(0, len(answer), step)) == expected, step


# ------------------------------------------------------------------ vLLM load from /metrics

VLLM_METRICS = b"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99
vllm:num_requests_running_total_weird{model_name="m"} 100
vllm:request_success_total{finished_reason="stop",model_name="m"} 12.0
"""


def test_load_sums_label_sets_and_prefers_the_newer_kv_metric() -> None:
    assert gauges(parse_vllm_load(VLLM_METRICS)) == (4.0, 7.0, 0.25)


def test_load_falls_back_to_the_older_gpu_cache_metric() -> None:
    text = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\nvllm:num_requests_waiting 2\n'
    assert gauges(parse_vllm_load(text)) == (0.0, 2.0, 0.5)


def test_load_of_an_engine_without_vllm_metrics_is_unknown_zero() -> None:
    assert parse_vllm_load("process_cpu_seconds_total 1\n") == VllmLoad()


def test_load_skips_garbage_lines() -> None:
    text = (
        "vllm:num_requests_running{x} nan-ish\n"
        "vllm:num_requests_running\n"
        'vllm:num_requests_waiting{m="a"}\n'
        "vllm:num_requests_waiting 1\n"
        "vllm:num_requests_waiting NaN\n"
        "vllm:num_requests_waiting +Inf\n"
        "vllm:num_requests_waiting 1e999\n"
        "vllm:num_requests_running " + "9" * 400 + "\n"
        "  vllm:num_requests_running 5\n"
        "vllm:num_requests_running\t2 1700000000000\r\n"
        'vllm:num_requests_running{a="} 7",b="\\"}"} 3'
    )
    assert parse_vllm_load(text) == VllmLoad(running=5.0, waiting=1.0)


def test_a_line_over_the_limit_is_skipped_wherever_it_is_cut() -> None:
    long_line = b'vllm:num_requests_waiting{x="' + b"y" * MAX_LINE + b'"} 5\n'
    text = b"vllm:num_requests_running 1\n" + long_line + b"vllm:num_requests_waiting 2\n"
    for step in (0, 1000, 8192, MAX_LINE):
        cuts = range(0, len(text), step) if step else ()
        assert read_load(text, cuts) == VllmLoad(running=1.0, waiting=2.0), step


VLLM_CACHE_METRICS = b"""\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4096.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 1024.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 2048.0
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 99.0
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 98.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",gpu_memory_utilization="0.9",hash_block_size="None",mamba_block_size="None",\
num_cpu_blocks="None",num_gpu_blocks="27349",num_gpu_blocks_override="None",\
prefix_caching_hash_algo="sha256",user_specified_block_size="32"} 1.0
"""


def test_prefix_cache_counters_are_summed_and_the_newer_names_win() -> None:
    load = parse_vllm_load(VLLM_CACHE_METRICS)
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (5120.0, 2048.0)


def test_the_older_gpu_prefix_cache_counters_are_read_when_alone() -> None:
    text = (
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 300.0\n'
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 100.0\n'
    )
    load = parse_vllm_load(text)
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (300.0, 100.0)


def test_cache_size_comes_from_the_cache_config_labels_and_no_other() -> None:
    load = parse_vllm_load(VLLM_CACHE_METRICS)
    assert (load.kv_capacity_blocks, load.kv_block_size) == (27349, 16)


@pytest.mark.parametrize(
    "labels",
    [
        '{block_size="None",num_gpu_blocks="None"}',
        '{block_size="0",num_gpu_blocks="-5"}',
        '{note="x,block_size=\\"8\\",num_gpu_blocks=\\"9\\""}',
        "",
    ],
)
def test_cache_config_values_that_are_not_counts_leave_the_size_unknown(labels: str) -> None:
    load = parse_vllm_load(f"vllm:cache_config_info{labels} 1.0\n")
    assert (load.kv_capacity_blocks, load.kv_block_size) == (None, None)


def test_an_engine_without_a_prefix_cache_says_nothing_of_it() -> None:
    load = parse_vllm_load(VLLM_METRICS)
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (None, None)
    assert (load.kv_capacity_blocks, load.kv_block_size) == (None, None)


def test_cache_figures_are_the_same_wherever_the_answer_is_cut() -> None:
    whole = read_load(VLLM_CACHE_METRICS)
    for step in (1, 7, 100, 4096):
        assert read_load(VLLM_CACHE_METRICS, range(0, len(VLLM_CACHE_METRICS), step)) == whole


VLLM_TOKEN_METRICS = b"""\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1200.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 800.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 300.0
vllm:generation_tokens_total{engine="1",model_name="m"} 45.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 9999.0
vllm:request_generation_tokens_sum{engine="0",model_name="m"} 9999.0
"""


def test_progress_is_prompt_and_generated_tokens_summed_over_label_sets() -> None:
    assert parse_vllm_load(VLLM_TOKEN_METRICS).progress == 2345.0


def test_progress_counts_either_token_counter_alone_and_is_unknown_without_both() -> None:
    v0 = 'vllm:generation_tokens_total{model_name="m"} 5.0\n'  # v0: no engine label
    assert parse_vllm_load(v0).progress == 5.0
    assert parse_vllm_load(VLLM_METRICS).progress is None


def test_progress_is_the_same_wherever_the_answer_is_cut() -> None:
    for step in (1, 7, 100):
        cuts = range(0, len(VLLM_TOKEN_METRICS), step)
        assert read_load(VLLM_TOKEN_METRICS, cuts).progress == 2345.0


def test_progress_whose_sum_is_not_finite_is_unknown() -> None:
    text = "vllm:prompt_tokens_total 1e308\nvllm:generation_tokens_total 1e308\n"
    assert parse_vllm_load(text).progress is None


_metric_lines = st.one_of(
    st.builds(
        lambda name, labels, value, tail: f"{name}{labels} {value}{tail}",
        st.sampled_from(
            [
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "vllm:prefix_cache_hits_total",
                "vllm:gpu_prefix_cache_queries_total",
                "vllm:cache_config_info",
                "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total",
                "vllm:num_requests_running_x",
                "# TYPE vllm:num_requests_running",
                "vllm:other",
            ]
        ),
        st.sampled_from(
            [
                "",
                "{}",
                '{m="a"}',
                '{m="}",n="\\""}',
                "{bad",
                '{m="a\\\\"}',
                '{block_size="16",num_gpu_blocks="99"}',
                '{x="num_gpu_blocks=\\"7\\"",num_gpu_blocks="None"}',
            ]
        ),
        st.floats(allow_nan=True, allow_infinity=True).map(repr) | st.text(max_size=4),
        st.sampled_from(["", " 1700000000", "\r", " junk"]),
    ),
    st.text(max_size=30),
)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_metric_lines, max_size=20), cuts=_cut_points)
def test_load_is_the_same_whatever_the_pieces(lines: Sequence[str], cuts: list[int]) -> None:
    text = "\n".join(lines).encode("utf-8", "surrogatepass")
    whole = read_load(text)
    assert read_load(text, cuts) == whole
    assert all(v is None or math.isfinite(v) for v in dataclasses.astuple(whole))
