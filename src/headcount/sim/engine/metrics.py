"""The engine's Prometheus exposition under vLLM's metric names, computed from its real state.

A router scrapes `/metrics` for load: v1 names (with an `engine` label) by
default, v0 names with `legacy_metrics`, since a fleet may run either. With a
prefix cache, KV usage is the share of blocks requests hold (vLLM's
definition), `num_preemptions_total` counts the requests preempted when
blocks ran out, the prefix-cache counters count prompt tokens queried and
found at (first) admission, and `vllm:cache_config_info` carries `block_size` and
`num_gpu_blocks` among vLLM's cache settings. The token counters move as the
engine prefills and generates (an unstreamed answer's tokens too, long before
its head is sent) and stand still while it is stalled.

Every value is read from the engine's state at scrape time: vLLM sets its
gauges at every engine step (`PrometheusStatLogger.record`), so its own are
never older than a step; only its log line waits for an interval.
"""

from __future__ import annotations

from headcount.sim.engine.state import EngineState

__all__ = ["PROMETHEUS_HEADERS", "render_metrics"]

PROMETHEUS_HEADERS = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

_HELP_RUNNING = "Number of requests in model execution batches."
_HELP_WAITING = "Number of requests waiting to be processed."
_HELP_KV = "KV-cache usage. 1 means 100 percent usage."
_HELP_SUCCESS = "Count of successfully processed requests."
_HELP_PROMPT = "Number of prefill tokens processed."
_HELP_GENERATION = "Number of generation tokens processed."
_HELP_QUERIES = "Prefix cache queries, in terms of number of queried tokens."
_HELP_HITS = "Prefix cache hits, in terms of number of cached tokens."
_HELP_CACHE_CONFIG = "Information of the LLMEngine CacheConfig"
_HELP_PREEMPTIONS = "Cumulative number of preemption from the engine."


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(state: EngineState) -> str:
    """vLLM's metric names; v1 adds an `engine` label that v0 (legacy) did not have."""
    config, caching = state.config, state.caching
    model = _label_value(config.model)
    labels = f'model_name="{model}"'
    if not config.legacy_metrics:
        labels = f'engine="0",{labels}'
    success_labels = f'{labels},finished_reason="length"'
    kv_name = "gpu_cache_usage_perc" if config.legacy_metrics else "kv_cache_usage_perc"
    running, waiting = state.load()
    usage = caching.kv.pool.usage if caching is not None else state.scheduler.kv_cache_usage
    samples = [
        ("num_requests_running", "gauge", _HELP_RUNNING, labels, running),
        ("num_requests_waiting", "gauge", _HELP_WAITING, labels, waiting),
        (kv_name, "gauge", _HELP_KV, labels, usage),
        ("request_success_total", "counter", _HELP_SUCCESS, success_labels, state.served),
        ("prompt_tokens_total", "counter", _HELP_PROMPT, labels, state.prompt_tokens),
        ("generation_tokens_total", "counter", _HELP_GENERATION, labels, state.generation_tokens),
    ]
    if caching is not None:
        kv, preemptions = caching.kv, state.scheduler.preemptions
        cache_labels = (
            f'block_size="{kv.block_size}",cache_dtype="auto",enable_prefix_caching="True",'
            f'engine="0",num_gpu_blocks="{kv.pool.num_gpu_blocks}",'
            'prefix_caching_hash_algo="sha256"'
        )
        samples += [
            ("prefix_cache_queries_total", "counter", _HELP_QUERIES, labels, kv.queries),
            ("prefix_cache_hits_total", "counter", _HELP_HITS, labels, kv.hits),
            ("num_preemptions_total", "counter", _HELP_PREEMPTIONS, labels, preemptions),
            ("cache_config_info", "gauge", _HELP_CACHE_CONFIG, cache_labels, 1),
        ]
    lines: list[str] = []
    for name, kind, help_text, sample_labels, value in samples:
        lines += [
            f"# HELP vllm:{name} {help_text}",
            f"# TYPE vllm:{name} {kind}",
            f"vllm:{name}{{{sample_labels}}} {float(value)}",
        ]
    return "\n".join(lines) + "\n"
