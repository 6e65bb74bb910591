"""The benchmarks' verdicts rest on a few pure helpers: they are checked here, without I/O.

The soak excuses a failed request only if at some moment of its life no engine
was healthy; the hostile bench ranks latencies by nearest rank and frames a
body as 2-byte chunks without a Python loop per chunk.
"""

from __future__ import annotations

import pytest

from bench.hostile.programs.attacks import nested_arrays_body, two_byte_chunks
from bench.hostile.report import percentile
from bench.soak.chaos import covered


@pytest.mark.parametrize(
    ("intervals", "start", "end", "expected"),
    [
        ([(0.0, None)], 1.0, 9.0, True),
        ([(0.0, 5.0)], 1.0, 9.0, False),
        ([(2.0, None)], 1.0, 9.0, False),
        # No single engine was healthy throughout, but one always was: not excused.
        ([(0.0, 5.0), (3.0, None)], 1.0, 9.0, True),
        ([(3.0, None), (0.0, 5.0)], 1.0, 9.0, True),
        ([(0.0, 4.0), (4.0, 6.0), (5.5, 9.0)], 1.0, 9.0, True),
        # A moment with no healthy engine (between 2 and 4): excused.
        ([(0.0, 2.0), (4.0, None)], 1.0, 9.0, False),
        ([], 1.0, 9.0, False),
    ],
)
def test_a_failure_is_excused_only_by_a_moment_without_a_healthy_engine(
    intervals: list[tuple[float, float | None]], start: float, end: float, expected: bool
) -> None:
    assert covered(intervals, start, end) is expected


def test_percentiles_are_nearest_rank() -> None:
    values = [float(n) for n in range(100, 0, -1)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def _unchunk(wire: bytes) -> list[bytes]:
    chunks, at = [], 0
    while at < len(wire):
        line_end = wire.index(b"\r\n", at)
        size = int(wire[at:line_end], 16)
        chunks.append(wire[line_end + 2 : line_end + 2 + size])
        assert wire[line_end + 2 + size : line_end + 4 + size] == b"\r\n"
        at = line_end + 4 + size
    return chunks


@pytest.mark.parametrize("size", [40, 41, 1000, 1001])
def test_a_body_framed_in_two_byte_chunks_is_the_body(size: int) -> None:
    body = nested_arrays_body(size)
    chunks = _unchunk(two_byte_chunks(body))
    assert b"".join(chunks) == body
    assert all(len(chunk) == 2 for chunk in chunks[:-1])
    assert b"0\r\n\r\n" not in two_byte_chunks(body)
