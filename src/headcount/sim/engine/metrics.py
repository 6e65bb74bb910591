"""The engine's Prometheus exposition under vLLM's metric names, computed from its real state.

A router scrapes `/metrics` for load: v1 names (with an `engine` label) by
default, v0 names with `legacy_metrics`, since a fleet may run either.
"""

from __future__ import annotations

from headcount.sim.engine.config import EngineSimConfig
from headcount.sim.engine.scheduler import Scheduler

__all__ = ["PROMETHEUS_HEADERS", "render_metrics"]

PROMETHEUS_HEADERS = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

_HELP_RUNNING = "Number of requests in model execution batches."
_HELP_WAITING = "Number of requests waiting to be processed."
_HELP_KV = "KV-cache usage. 1 means 100 percent usage."
_HELP_SUCCESS = "Count of successfully processed requests."


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(config: EngineSimConfig, scheduler: Scheduler, served: int) -> str:
    """vLLM's metric names; v1 adds an `engine` label that v0 (legacy) did not have."""
    model = _label_value(config.model)
    labels = f'model_name="{model}"'
    if not config.legacy_metrics:
        labels = f'engine="0",{labels}'
    success_labels = f'{labels},finished_reason="length"'
    kv_name = "gpu_cache_usage_perc" if config.legacy_metrics else "kv_cache_usage_perc"
    samples = (
        ("num_requests_running", "gauge", _HELP_RUNNING, labels, scheduler.running),
        ("num_requests_waiting", "gauge", _HELP_WAITING, labels, scheduler.waiting),
        (kv_name, "gauge", _HELP_KV, labels, scheduler.kv_cache_usage),
        ("request_success_total", "counter", _HELP_SUCCESS, success_labels, served),
    )
    lines: list[str] = []
    for name, kind, help_text, sample_labels, value in samples:
        lines += [
            f"# HELP vllm:{name} {help_text}",
            f"# TYPE vllm:{name} {kind}",
            f"vllm:{name}{{{sample_labels}}} {float(value)}",
        ]
    return "\n".join(lines) + "\n"
