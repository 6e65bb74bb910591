"""How one simulated engine listens, what it serves and how it behaves, checked once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from headcount.sim.engine.kv_events_config import KvEventsConfig

__all__ = ["FAIL_MODES", "EngineSimConfig", "FailMode"]

FailMode = Literal["none", "refuse", "hang", "die-mid-stream", "http-500"]
FAIL_MODES: tuple[FailMode, ...] = get_args(FailMode)


@dataclass(frozen=True)
class EngineSimConfig:
    """How one simulated engine listens, what it serves and how it behaves."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port; `refuse` and back keeps whichever port was picked."""
    model: str = "sim-model"
    adapters: tuple[str, ...] = ()
    """LoRA adapter names, served next to the base model (replaceable at runtime)."""
    token_delay: float = 0.0
    """Seconds per generated token, the first one included."""
    fail_mode: FailMode = "none"
    max_running: int | None = None
    """Requests generating at once; the rest wait. None: no limit."""
    name: str | None = None
    """Reported in `x-engine-name` and `system_fingerprint`; default `host:port`."""
    legacy_metrics: bool = False
    """Expose `vllm:gpu_cache_usage_perc` (vLLM v0) instead of `vllm:kv_cache_usage_perc`."""
    max_model_len: int = 4096
    api_key: str | None = None
    """As vLLM's `--api-key`: `/v1/` requests need `Authorization: Bearer <key>`. None: open."""
    kv_events: KvEventsConfig | None = None
    """Publish vLLM's KV-cache events over ZMQ (`kv_publisher`). None: off."""

    def __post_init__(self) -> None:
        if self.fail_mode not in FAIL_MODES:
            raise ValueError(f"fail_mode must be one of {', '.join(FAIL_MODES)}")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError("max_running must be at least 1 (or None for no limit)")
        if self.token_delay < 0 or not math.isfinite(self.token_delay):
            raise ValueError("token_delay must be a finite number of seconds >= 0")
        if self.max_model_len < 1:
            raise ValueError("max_model_len must be at least 1")
