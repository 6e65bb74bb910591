"""Reading an engine's answers: `/v1/models` cards and vLLM's load metrics."""

from __future__ import annotations

import pytest

from headcount.probe import ProbeError, parse_model_cards, parse_vllm_load

VLLM_METRICS = """\
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
    assert parse_vllm_load(VLLM_METRICS) == (4.0, 7.0, 0.25)


def test_load_falls_back_to_the_older_gpu_cache_metric() -> None:
    text = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\nvllm:num_requests_waiting 2\n'
    assert parse_vllm_load(text) == (0.0, 2.0, 0.5)


def test_load_of_an_engine_without_vllm_metrics_is_unknown_zero() -> None:
    assert parse_vllm_load("process_cpu_seconds_total 1\n") == (0.0, 0.0, None)


def test_load_skips_garbage_lines() -> None:
    text = (
        "vllm:num_requests_running{x} nan-ish\n"
        "vllm:num_requests_running\n"
        'vllm:num_requests_waiting{m="a"}\n'
        "vllm:num_requests_waiting 1\n"
    )
    assert parse_vllm_load(text) == (0.0, 1.0, None)


def test_model_cards_keep_entries_with_an_id() -> None:
    payload = {"object": "list", "data": [{"id": "m", "max_model_len": 8}, {"no": "id"}, "x"]}
    assert parse_model_cards(payload) == ({"id": "m", "max_model_len": 8},)


@pytest.mark.parametrize("payload", [[], {"data": "x"}, {"data": []}, None])
def test_model_cards_reject_answers_that_are_not_a_model_list(payload: object) -> None:
    with pytest.raises(ProbeError):
        parse_model_cards(payload)
