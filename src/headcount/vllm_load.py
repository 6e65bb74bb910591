"""Reading vLLM's load gauges from an engine's `/metrics` as it streams in.

The router needs three numbers from an exposition that may run to megabytes
(histograms for every adapter): requests running and waiting, and KV-cache
usage. `LoadParser` takes the text in pieces as they arrive and finds the few
`vllm:` lines it wants with one compiled expression per piece, in C, so each
piece costs time in proportion to its size and memory stays one line long.
Values of every label set are summed; the newer `kv_cache_usage_perc` wins
over the older `gpu_cache_usage_perc`. Lines it cannot read are skipped, as
are values (and sums) that are not finite and lines over `MAX_LINE` bytes;
where the text is split into pieces never changes the outcome, and pieces of
any size cost time in proportion to their size.
"""

from __future__ import annotations

import math
import re
from typing import Final

__all__ = ["MAX_LINE", "LoadParser", "parse_vllm_load"]

MAX_LINE: Final = 64 * 1024
"""Longest line read; a vLLM gauge line with its labels is a few hundred bytes."""

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")

# A wanted line, anchored on the newline before it: name, optional labels (quotes respected),
# blanks, the value, and the rest of the line (a timestamp) up to its newline, which stays for
# the next line's match.
_LINE = re.compile(
    rb"\n(vllm:(?:num_requests_running|num_requests_waiting|kv_cache_usage_perc"
    rb"|gpu_cache_usage_perc))"
    rb'(?:\{(?:[^"}\n]++|"(?:[^"\\\n]++|\\.)*+")*+\})?+'
    rb"[ \t]++([^ \t\r\n]++)[^\n]*+(?=\n)"
)


class LoadParser:
    """Feed it `/metrics` in pieces, then `close()` for (running, waiting, kv-cache usage)."""

    full = False
    """Never: the gauges may come last, so the whole answer is read."""

    def __init__(self) -> None:
        self._sums: dict[bytes, float] = {}
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
            try:
                value = float(match.group(2))
            except ValueError:
                continue
            name = match.group(1)
            total = sums.get(name, 0.0) + value
            if math.isfinite(total):
                sums[name] = total
        self._line = bytearray(data[last:])
        self._extend(b"")

    def close(self) -> tuple[float, float, float | None]:
        self.feed(b"\n")
        sums = {name.decode(): value for name, value in self._sums.items()}
        kv = next((sums[name] for name in _KV_USAGE if name in sums), None)
        return sums.get(_RUNNING, 0.0), sums.get(_WAITING, 0.0), kv

    def _extend(self, data: bytes) -> None:
        if self._line:
            self._line += data
            if len(self._line) > MAX_LINE + 1:
                self._line = bytearray()


def parse_vllm_load(text: str | bytes) -> tuple[float, float, float | None]:
    """(running, waiting, kv-cache usage) from a whole `/metrics` answer."""
    parser = LoadParser()
    parser.feed(text.encode() if isinstance(text, str) else text)
    return parser.close()
