"""Confidence intervals over seeds: Student's t on the per-seed values."""

from __future__ import annotations

import pytest

from bench.routing.intervals import interval


def test_the_interval_is_t_times_the_standard_error() -> None:
    # mean 2, sample sd 1, n 3: 4.303 / sqrt(3) = 2.484
    mean, half = interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(2.484, abs=1e-3)
    assert interval([5.0, 5.0])[1] == 0.0


def test_one_seed_has_no_interval() -> None:
    assert interval([0.7]) == (0.7, None)
