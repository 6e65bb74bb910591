"""The routing benchmark's numbers: a row per target and load, the table, the TTFT plot."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.routing.intervals import interval
from bench.routing.loadgen import Outcome

__all__ = [
    "LAG_WARNING_MS",
    "Recovery",
    "Row",
    "highest_load_summary",
    "lag_warnings",
    "plot",
    "recovery",
    "render_cells",
    "render_recoveries",
    "render_table",
    "summarise",
]


@dataclass(frozen=True)
class Row:
    workload: str
    target: str
    rate: float
    sent: int
    failed: int
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    e2e_p50: float | None
    e2e_p90: float | None
    out_tok_s: float
    hit_rate: float | None
    router_cpu_us: float | None
    lag_p99_ms: float
    split: str
    ttft_mean: float | None = None
    seed: int = 0


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(
    workload: str,
    target: str,
    rate: float,
    outcomes: Sequence[Outcome],
    window_s: float,
    hits: float | None,
    router_cpu_s: float | None,
    split: str,
) -> Row:
    """A row from the measured requests (`outcomes`, sent over `window_s` seconds).

    `hits` is the engines' hit rate over the window; CPU is per request sent.
    """
    ok = [o for o in outcomes if o.error is None]
    ttft = [o.ttft_s for o in ok if o.ttft_s is not None]
    e2e = [o.e2e_s for o in ok if o.e2e_s is not None]
    lag = [o.lag_s for o in outcomes]
    cpu = None if router_cpu_s is None or not outcomes else router_cpu_s * 1e6 / len(outcomes)
    return Row(
        workload=workload,
        target=target,
        rate=rate,
        sent=len(outcomes),
        failed=len(outcomes) - len(ok),
        ttft_p50=_pct(ttft, 0.5),
        ttft_p90=_pct(ttft, 0.9),
        ttft_p99=_pct(ttft, 0.99),
        e2e_p50=_pct(e2e, 0.5),
        e2e_p90=_pct(e2e, 0.9),
        out_tok_s=sum(o.output_tokens for o in ok) / window_s if window_s > 0 else 0.0,
        hit_rate=hits,
        router_cpu_us=cpu,
        lag_p99_ms=(_pct(lag, 0.99) or 0.0) * 1e3,
        split=split,
        ttft_mean=statistics.fmean(ttft) if ttft else None,
    )


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


_HEAD = (
    "| target | load req/s | seed | sent | failed | TTFT p50 s | TTFT p90 s | TTFT p99 s "
    "| e2e p50 s | e2e p90 s | output tok/s | cache hit % | router CPU µs/req "
    "| engine split % | gen lag p99 ms |\n"
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
)


def render_table(rows: Sequence[Row]) -> str:
    lines = [_HEAD]
    for row in rows:
        hit = "—" if row.hit_rate is None else f"{100 * row.hit_rate:.1f}"
        cpu = "—" if row.router_cpu_us is None else f"{row.router_cpu_us:,.0f}"
        lines.append(
            f"| {row.target} | {row.rate:g} | {row.seed} | {row.sent} | {row.failed} "
            f"| {_s(row.ttft_p50)} "
            f"| {_s(row.ttft_p90)} | {_s(row.ttft_p99)} | {_s(row.e2e_p50)} | {_s(row.e2e_p90)} "
            f"| {row.out_tok_s:.0f} | {hit} | {cpu} | {row.split} | {row.lag_p99_ms:.1f} |"
        )
    return "\n".join(lines)


def _ci(values: Sequence[float | None], scale: float = 1.0, digits: int = 2) -> str:
    known = [scale * v for v in values if v is not None]
    if not known:
        return "—"
    mean, half = interval(known)
    return f"{mean:.{digits}f}" + ("" if half is None else f" ± {half:.{digits}f}")


_CELL_HEAD = (
    "| target | load req/s | seeds | measured | failed | cache hit % | TTFT mean s | TTFT p90 s "
    "| TTFT p99 s | e2e p90 s | router CPU µs/req | engine split % per seed | gen lag p99 ms |\n"
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|"
)


def render_cells(rows: Sequence[Row]) -> str:
    """One line per target and load: the mean over seeds, ± the 95 % interval (`intervals.py`)."""
    lines = [_CELL_HEAD]
    for target, rate in dict.fromkeys((row.target, row.rate) for row in rows):
        cell = [row for row in rows if row.target == target and row.rate == rate]
        cpu = [row.router_cpu_us for row in cell if row.router_cpu_us is not None]
        lines.append(
            f"| {target} | {rate:g} | {len(cell)} | {sum(r.sent for r in cell)} "
            f"| {sum(r.failed for r in cell)} | {_ci([r.hit_rate for r in cell], 100, 1)} "
            f"| {_ci([r.ttft_mean for r in cell])} | {_ci([r.ttft_p90 for r in cell])} "
            f"| {_ci([r.ttft_p99 for r in cell])} | {_ci([r.e2e_p90 for r in cell])} "
            f"| {statistics.fmean(cpu) if cpu else 0:,.0f} | {'; '.join(r.split for r in cell)} "
            f"| {max(r.lag_p99_ms for r in cell):.1f} |"
        )
    return "\n".join(lines)


LAG_WARNING_MS = 50.0
"""A generator later than this at p99 shaped the numbers itself."""


def lag_warnings(rows: Sequence[Row]) -> list[str]:
    return [
        f"- WARNING: the generator's send lag p99 was {row.lag_p99_ms:.0f} ms for {row.target} "
        f"at {row.rate:g} req/s, seed {row.seed} (over {LAG_WARNING_MS:g} ms): the generator, "
        "not only the router, shaped that run's times"
        for row in rows
        if row.lag_p99_ms > LAG_WARNING_MS
    ]


def highest_load_summary(rows: Sequence[Row]) -> str:
    """TTFT p90 and hit rate per target at the highest load, and headcount's gap to the oracle
    (`rows` of one workload)."""
    if not rows:
        return ""
    top = max(row.rate for row in rows)
    at_top = [row for row in rows if row.rate == top]
    lines = [f"At {rows[0].workload}'s highest load ({top:g} req/s), seed {rows[0].seed}:", ""]
    at_top = [row for row in at_top if row.seed == rows[0].seed]
    for row in sorted(at_top, key=lambda r: r.ttft_p90 if r.ttft_p90 is not None else 1e9):
        hit = "—" if row.hit_rate is None else f"{100 * row.hit_rate:.1f} %"
        lines.append(f"- {row.target}: TTFT p90 {_s(row.ttft_p90)} s, hit rate {hit}")
    ours = [r for r in at_top if r.target.startswith("headcount") and r.ttft_p90 is not None]
    oracle = next((r for r in at_top if r.target == "oracle" and r.ttft_p90), None)
    if ours and oracle is not None and oracle.ttft_p90:
        best = min(ours, key=lambda r: r.ttft_p90 or 0.0)
        assert best.ttft_p90 is not None
        lines += [
            "",
            f"Best headcount policy: {best.target}, TTFT p90 {best.ttft_p90:.2f} s = "
            f"{best.ttft_p90 / oracle.ttft_p90:.1f}x the oracle's {oracle.ttft_p90:.2f} s.",
        ]
    return "\n".join(lines)


def plot(rows: Sequence[Row], paths: Sequence[Path]) -> None:
    """TTFT p90 (the mean over seeds) against load, one line per workload and target, written to
    every path in `paths`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5), dpi=110)
    for workload, target in dict.fromkeys((row.workload, row.target) for row in rows):
        own = [r for r in rows if r.workload == workload and r.target == target and r.ttft_p90]
        points = [
            (rate, statistics.fmean(r.ttft_p90 or 0.0 for r in own if r.rate == rate))
            for rate in sorted({r.rate for r in own})
        ]
        if points:
            style = "k--" if target == "oracle" else "-o"
            label = f"{workload}: {target}"
            axes.plot(*zip(*points, strict=True), style, label=label, markersize=4)
    axes.set_xlabel("offered load (requests/s, Poisson)")
    axes.set_ylabel("TTFT p90 (s)")
    axes.set_yscale("log")
    axes.set_title("Routing quality: TTFT p90 vs load, 4 simulated engines")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    for path in paths:
        figure.savefig(path)
    plt.close(figure)


@dataclass(frozen=True)
class Recovery:
    """TTFT around an event-stream fault injected `fault_s` seconds into the run."""

    target: str
    rate: float
    fault: str
    before_p90: float | None
    """Over the measured requests sent before the fault."""
    series: tuple[tuple[float, float | None], ...]
    """(seconds after the fault, TTFT p90 of requests sent in the window starting then)."""
    recovered_after_s: float | None
    """From the fault until every later window's p90 stays within the bound; None: never."""


RECOVERY_WINDOW_S = 4.0
"""Each point of the series is the p90 over requests sent in this many seconds."""
_RECOVERY_STEP_S = 1.0


def recovery(
    target: str,
    rate: float,
    fault: str,
    outcomes: Sequence[Outcome],
    window: tuple[float, float, float],
) -> Recovery:
    """`window` = (measured from, fault at, measured until), seconds into the run. Recovered:
    every later window's p90 at most 1.2x the pre-fault p90 plus 50 ms (noise on 2 cores)."""
    start, fault_s, end = window

    def p90(lo: float, hi: float) -> float | None:
        ttft = [
            o.ttft_s
            for o in outcomes
            if lo <= o.arrival.at_s < hi and o.error is None and o.ttft_s is not None
        ]
        return _pct(ttft, 0.9)

    before = p90(start, fault_s)
    series: list[tuple[float, float | None]] = []
    at = fault_s
    while at + RECOVERY_WINDOW_S <= end:
        series.append((at - fault_s, p90(at, at + RECOVERY_WINDOW_S)))
        at += _RECOVERY_STEP_S
    recovered: float | None = None
    if before is not None:
        bound = 1.2 * before + 0.05
        for index, (offset, _) in enumerate(series):
            if all(value is not None and value <= bound for _, value in series[index:]):
                recovered = offset + RECOVERY_WINDOW_S
                break
    return Recovery(target, rate, fault, before, tuple(series), recovered)


def render_recoveries(recoveries: Sequence[Recovery]) -> str:
    if not recoveries:
        return ""
    lines = [
        f"Fault run: TTFT p90 per {RECOVERY_WINDOW_S:g}-s window of sends, by seconds after "
        "the fault; recovered = from the fault to the end of the first window from which every "
        "window stays within 1.2x the pre-fault p90 + 50 ms.",
        "",
        "| target | load req/s | fault | p90 before s | recovered after s | p90 series s |",
        "|---|--:|---|--:|--:|---|",
    ]
    for each in recoveries:
        series = " ".join(f"{offset:g}:{_s(value)}" for offset, value in each.series)
        after = "never" if each.recovered_after_s is None else f"{each.recovered_after_s:g}"
        lines.append(
            f"| {each.target} | {each.rate:g} | {each.fault} | {_s(each.before_p90)} "
            f"| {after} | {series} |"
        )
    return "\n".join(lines)
