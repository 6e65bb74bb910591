"""The routing report's cells: a line per target and load over seeds, and the generator's lag."""

from __future__ import annotations

import dataclasses

from bench.routing.report import Row, lag_warnings, render_cells

_ROW = Row(
    workload="pressure",
    target="t",
    rate=16.0,
    sent=500,
    failed=0,
    ttft_p50=0.1,
    ttft_p90=0.5,
    ttft_p99=0.9,
    e2e_p50=0.6,
    e2e_p90=1.0,
    out_tok_s=400.0,
    hit_rate=0.70,
    router_cpu_us=4000.0,
    lag_p99_ms=4.0,
    split="25/25/25/25",
    ttft_mean=0.2,
    seed=9,
)


def test_a_cell_is_the_mean_over_seeds_with_its_t_interval_and_every_request_counted() -> None:
    rows = [_ROW, dataclasses.replace(_ROW, seed=10, hit_rate=0.72, sent=520, ttft_mean=0.3)]
    line = render_cells(rows).splitlines()[-1]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[:5] == ["t", "16", "2", "1020", "0"]
    # hit %: mean 71.0, sd 1.414, t(1) 12.706 / sqrt(2) -> 12.7
    assert cells[5] == "71.0 ± 12.7"
    assert cells[6] == "0.25 ± 0.64"


def test_the_generators_lag_is_flagged_only_when_it_shaped_the_run() -> None:
    late = dataclasses.replace(_ROW, lag_p99_ms=80.0, seed=10)
    warnings = lag_warnings([_ROW, late])
    assert len(warnings) == 1
    assert "80 ms" in warnings[0] and "seed 10" in warnings[0]
