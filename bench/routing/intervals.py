"""95 % confidence intervals over seeds: Student's t on the per-seed values of a cell.

Each seed is a run with its own requests (and its own tenants' prompts), so
the per-seed values of a number (hit rate, mean TTFT, a TTFT percentile) are
independent draws of it; the interval is mean +- t(0.975, n - 1) * s / sqrt(n)
with s their sample standard deviation. With one seed there is none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["T_975", "interval"]

T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student's t 97.5 % quantile for 1..10 degrees of freedom (beyond: the normal's 1.96
is within 10 % of it from 12 on; 2.2 is used up to 20)."""


def _t(freedom: int) -> float:
    if freedom <= len(T_975):
        return T_975[freedom - 1]
    return 2.2 if freedom <= 20 else 1.96


def interval(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95 % interval; None with fewer than two values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, _t(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
