"""Reading vLLM's load and prefix-cache figures from an engine's `/metrics` as it streams in.

The router needs a few numbers from an exposition that may run to megabytes
(histograms for every adapter): requests running and waiting, KV-cache usage,
the prefix-cache counters (queried and hit tokens), the KV cache's size
(`num_gpu_blocks` and `block_size`, labels of `vllm:cache_config_info`) and
the token counters (`prompt_tokens_total`, `generation_tokens_total`: the
same names in v0 and v1), whose sum shows an engine working while it sends
nothing (`proxy/stalls.py`).
`LoadParser` takes the text in pieces as they arrive and finds the few `vllm:`
lines it wants with one compiled expression per piece, in C, so each piece
costs time in proportion to its size and memory stays one line long. Values of
every label set are summed; the newer names (`kv_cache_usage_perc`,
`prefix_cache_*_total`) win over the older `gpu_` ones. Lines it cannot read
are skipped, as are values (and sums) that are not finite and lines over
`MAX_LINE` bytes; where the text is split into pieces never changes the
outcome, and pieces of any size cost time in proportion to their size.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_LINE", "LoadParser", "VllmLoad", "parse_vllm_load"]

MAX_LINE: Final = 64 * 1024
"""Longest line read; a vLLM gauge line with its labels is a few hundred bytes (the cache
config's, with every cache setting, about two thousand)."""

_RUNNING = b"vllm:num_requests_running"
_WAITING = b"vllm:num_requests_waiting"
_KV_USAGE = (b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc")
_QUERIES = (b"vllm:prefix_cache_queries_total", b"vllm:gpu_prefix_cache_queries_total")
_HITS = (b"vllm:prefix_cache_hits_total", b"vllm:gpu_prefix_cache_hits_total")
_TOKENS = (b"vllm:prompt_tokens_total", b"vllm:generation_tokens_total")
_CACHE_CONFIG = b"vllm:cache_config_info"
_CAPACITY, _BLOCK_SIZE = b"num_gpu_blocks", b"block_size"

# A wanted line, anchored on the newline before it: name, optional labels (quotes respected),
# blanks, the value, and the rest of the line (a timestamp) up to its newline, which stays for
# the next line's match.
_LINE = re.compile(
    rb"\n(vllm:(?:num_requests_running|num_requests_waiting|kv_cache_usage_perc"
    rb"|gpu_cache_usage_perc|(?:gpu_)?prefix_cache_(?:queries|hits)_total|cache_config_info"
    rb"|(?:prompt|generation)_tokens_total))"
    rb'(\{(?:[^"}\n]++|"(?:[^"\\\n]++|\\.)*+")*+\})?+'
    rb"[ \t]++([^ \t\r\n]++)[^\n]*+(?=\n)"
)
_LABEL = re.compile(rb'([a-zA-Z_]\w*+)="((?:[^"\\]++|\\.)*+)"')
_COUNT = re.compile(rb"[1-9]\d{0,17}")


@dataclass(frozen=True, slots=True)
class VllmLoad:
    """What one `/metrics` answer says; None where the engine did not say."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float | None = None
    prefix_cache_queries: float | None = None
    """Prompt tokens looked up in the prefix cache, ever (a counter)."""
    prefix_cache_hits: float | None = None
    """Of those, tokens found cached."""
    kv_capacity_blocks: int | None = None
    """`num_gpu_blocks`: the KV cache's blocks, vLLM's null block included."""
    kv_block_size: int | None = None
    """Tokens per KV block."""
    progress: float | None = None
    """Prompt and generated tokens processed, ever (the two counters' sum, or the one said)."""


class LoadParser:
    """Feed it `/metrics` in pieces, then `close()` for the `VllmLoad` it says."""

    full = False
    """Never: the gauges may come last, so the whole answer is read."""

    def __init__(self) -> None:
        self._sums: dict[bytes, float] = {}
        self._config: dict[bytes, int] = {}
        """`num_gpu_blocks` and `block_size` of the cache config (one engine core's: data-parallel
        ranks are routed as one engine and their caches are not indexed)."""
        self._line = bytearray(b"\n")
        """The unfinished last line, after the newline before it; empty while skipping a line
        over MAX_LINE (no match can start without that newline)."""

    def feed(self, data: bytes) -> None:
        last = data.rfind(b"\n")
        if last < 0:
            self._extend(data)
            return
        lines = self._line
        lines += data[: last + 1]
        sums = self._sums
        for match in _LINE.finditer(lines):
            if match.end() - match.start() - 1 > MAX_LINE:
                continue
            name = match.group(1)
            if name == _CACHE_CONFIG:
                self._read_cache_config(match.group(2) or b"")
                continue
            try:
                value = float(match.group(3))
            except ValueError:
                continue
            total = sums.get(name, 0.0) + value
            if math.isfinite(total):
                sums[name] = total
        self._line = bytearray(data[last:])
        self._extend(b"")

    def close(self) -> VllmLoad:
        self.feed(b"\n")
        sums, config = self._sums, self._config
        return VllmLoad(
            running=sums.get(_RUNNING, 0.0),
            waiting=sums.get(_WAITING, 0.0),
            kv_usage=_first(sums, _KV_USAGE),
            prefix_cache_queries=_first(sums, _QUERIES),
            prefix_cache_hits=_first(sums, _HITS),
            kv_capacity_blocks=config.get(_CAPACITY),
            kv_block_size=config.get(_BLOCK_SIZE),
            progress=_total(sums, _TOKENS),
        )

    def _read_cache_config(self, labels: bytes) -> None:
        for label in _LABEL.finditer(labels):
            key = label.group(1)
            if key in (_CAPACITY, _BLOCK_SIZE) and _COUNT.fullmatch(value := label.group(2)):
                self._config[key] = int(value)

    def _extend(self, data: bytes) -> None:
        if self._line:
            self._line += data
            if len(self._line) > MAX_LINE + 1:
                self._line = bytearray()


def _first(sums: dict[bytes, float], names: tuple[bytes, ...]) -> float | None:
    return next((sums[name] for name in names if name in sums), None)


def _total(sums: dict[bytes, float], names: tuple[bytes, ...]) -> float | None:
    said = [sums[name] for name in names if name in sums]
    total = sum(said)
    return total if said and math.isfinite(total) else None


def parse_vllm_load(text: str | bytes) -> VllmLoad:
    """What a whole `/metrics` answer says."""
    parser = LoadParser()
    parser.feed(text.encode() if isinstance(text, str) else text)
    return parser.close()
