"""How one simulated engine listens, what it serves and how it behaves, checked once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from headcount.sim.engine.kv_events_config import KvEventsConfig

__all__ = ["FAIL_MODES", "MID_STREAM_MODES", "EngineSimConfig", "FailMode"]

FailMode = Literal[
    "none",
    "refuse",
    "hang",
    "stall",
    "die-mid-stream",
    "truncate-mid-stream",
    "stall-mid-stream",
    "http-500",
]
FAIL_MODES: tuple[FailMode, ...] = get_args(FailMode)
MID_STREAM_MODES: frozenset[FailMode] = frozenset(
    {"die-mid-stream", "truncate-mid-stream", "stall-mid-stream"}
)
"""The modes that break a stream after `die_after_chunks` chunks."""


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
    die_after_chunks: int = 2
    """Chunks a stream sends before a mid-stream mode (`MID_STREAM_MODES`) breaks it."""
    max_running: int | None = None
    """Requests generating at once; the rest wait. None: no limit."""
    name: str | None = None
    """Reported in `x-engine-name` and `system_fingerprint`; default `host:port`."""
    legacy_metrics: bool = False
    """Expose `vllm:gpu_cache_usage_perc` (vLLM v0) instead of `vllm:kv_cache_usage_perc`."""
    max_model_len: int = 4096
    api_key: str | None = None
    """As vLLM's `--api-key`: `/v1/` requests need `Authorization: Bearer <key>`. None: open."""
    tokenizer: str | None = None
    """A Hugging Face tokenizer directory (`tokenizer.json`, chat template); None: built-in."""
    kv_blocks: int | None = None
    """vLLM's `num_gpu_blocks` (block 0 is the null block). Set: a prefix cache and prefill
    time are simulated (`prefill`, `kv_cache`). None: neither, prompts take no time."""
    block_size: int = 16
    """Tokens per KV block."""
    prefill_tokens_per_s: float = 16_000.0
    """Prompt tokens the engine prefills per second, shared by the requests prefilling."""
    kv_events: KvEventsConfig | None = None
    """Publish vLLM's KV-cache events over ZMQ (`kv_publisher`). None: off."""
    tls_cert: str | None = None
    """PEM certificate chain: serve https, as vLLM's `--ssl-certfile` (KV events stay plain
    ZMQ). None: plain HTTP."""
    tls_key: str | None = None
    """PEM key of `tls_cert`, as vLLM's `--ssl-keyfile`."""
    tls_client_ca: str | None = None
    """PEM CAs a client certificate must chain to; set, one is required (vLLM's
    `--ssl-ca-certs` with `--ssl-cert-reqs 2`). None: none asked for."""

    def __post_init__(self) -> None:
        if self.fail_mode not in FAIL_MODES:
            raise ValueError(f"fail_mode must be one of {', '.join(FAIL_MODES)}")
        if self.die_after_chunks < 0:
            raise ValueError("die_after_chunks must be at least 0")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError("max_running must be at least 1 (or None for no limit)")
        if self.token_delay < 0 or not math.isfinite(self.token_delay):
            raise ValueError("token_delay must be a finite number of seconds >= 0")
        if self.max_model_len < 1:
            raise ValueError("max_model_len must be at least 1")
        if self.kv_blocks is not None and self.kv_blocks < 2:
            raise ValueError("kv_blocks must be at least 2 (block 0 is the null block)")
        if self.block_size < 1:
            raise ValueError("block_size must be at least 1")
        if not (0 < self.prefill_tokens_per_s < math.inf):
            raise ValueError("prefill_tokens_per_s must be a finite number > 0")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together (or neither, plain HTTP)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key (https)")
