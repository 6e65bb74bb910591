"""The overload suite's numbers: a row per target and tenant, the issue's checks, the plot."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.overload.fleet import CAPACITY_RPS, SERVICE_S
from bench.overload.run import Measured
from bench.overload.tenants import BATCH, CAPPED, INTERACTIVE, SHEDDABLE, TENANTS
from bench.overload.traffic import Outcome

__all__ = ["TTFT_SLO_S", "checks", "plot", "render_points", "render_table", "summary"]

TTFT_SLO_S = 1.0
"""Goodput counts the requests served with a first token within this: two service times."""
SHARE_TOLERANCE = 0.10
LIMIT_TOLERANCE = 0.05
SHED_AT_ONCE_S = 0.1
"""A sheddable request refused later than this waited for something first."""


def _percentile(values: Sequence[float], q: int) -> float | None:
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass(frozen=True)
class TenantRow:
    target: str
    tenant: str
    sent: int
    served: int
    refused: dict[int, int]
    lost: int
    ttft: tuple[float | None, float | None, float | None]
    """p50, p90, p99 of the served requests."""
    goodput_rps: float
    tokens_per_min: float
    refusal_p99_s: float | None


def tenant_row(target: str, tenant: str, outcomes: Sequence[Outcome], window_s: float) -> TenantRow:
    served = [o for o in outcomes if o.served]
    ttft = [o.ttft_s for o in served if o.ttft_s is not None]
    refusals = [o for o in outcomes if o.status is not None and not o.served]
    good = sum(1 for value in ttft if value <= TTFT_SLO_S)
    return TenantRow(
        target=target,
        tenant=tenant,
        sent=len(outcomes),
        served=len(served),
        refused=dict(sorted(Counter(o.status for o in refusals if o.status).items())),
        lost=sum(1 for o in outcomes if o.lost),
        ttft=(_percentile(ttft, 50), _percentile(ttft, 90), _percentile(ttft, 99)),
        goodput_rps=good / window_s if window_s > 0 else 0.0,
        tokens_per_min=sum(o.tokens for o in served) * 60 / window_s if window_s > 0 else 0.0,
        refusal_p99_s=_percentile([o.elapsed_s for o in refusals], 99),
    )


def rows(measured: Measured) -> list[TenantRow]:
    traffic = measured.main
    if traffic is None:
        return []
    low, high = traffic.measured
    out = []
    for tenant in (INTERACTIVE,) if measured.target.alone else TENANTS:
        window = high - (traffic.late_s if tenant.late else low)
        out.append(
            tenant_row(measured.target.name, tenant.name, traffic.window(tenant.name), window)
        )
    return out


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _statuses(refused: dict[int, int]) -> str:
    return " ".join(f"{status}: {n}" for status, n in refused.items()) or "0"


def _shares(table: Sequence[TenantRow]) -> dict[str, float]:
    batch = {row.tenant: row.served for row in table if row.tenant in {t.name for t in BATCH}}
    total = sum(batch.values())
    return {name: served / total for name, served in batch.items()} if total else {}


def _weight_share(name: str) -> float:
    weights = {t.name: t.weight or 1.0 for t in BATCH}
    return weights[name] / sum(weights.values())


_HEAD = (
    "| target | tenant | sent | served | refused (status: n) | lost | TTFT p50 s | TTFT p90 s "
    f"| TTFT p99 s | goodput req/s (TTFT ≤ {TTFT_SLO_S:g} s) | share of batch engine time "
    "(weight's) | tokens/min (limit) |\n"
    "|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|"
)


def render_table(table: Sequence[TenantRow]) -> str:
    lines = [_HEAD]
    by_target: dict[str, list[TenantRow]] = {}
    for row in table:
        by_target.setdefault(row.target, []).append(row)
    for target_rows in by_target.values():
        shares = _shares(target_rows)
        for row in target_rows:
            refused = _statuses(row.refused)
            share = (
                f"{100 * shares[row.tenant]:.1f} % ({100 * _weight_share(row.tenant):.1f} %)"
                if row.tenant in shares
                else "—"
            )
            tokens = (
                f"{row.tokens_per_min:,.0f} ({CAPPED.tokens_per_minute:,})"
                if row.tenant == CAPPED.name
                else f"{row.tokens_per_min:,.0f}"
            )
            p50, p90, p99 = row.ttft
            lines.append(
                f"| {row.target} | {row.tenant} | {row.sent} | {row.served} | {refused} "
                f"| {row.lost} | {_s(p50)} | {_s(p90)} | {_s(p99)} | {row.goodput_rps:.1f} "
                f"| {share} | {tokens} |"
            )
    return "\n".join(lines)


@dataclass(frozen=True)
class Check:
    target: str
    what: str
    measured: str
    wanted: str
    passed: bool | None
    """None: could not be judged."""


def _verdict(passed: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[passed]


def checks(
    table: Sequence[TenantRow], lost_anywhere: dict[str, int], unsteady: set[str]
) -> list[Check]:
    """The issue's "Done when" targets, judged for every flooded target; `capped`'s limit not
    for the targets in `unsteady` (its minute never filled before the window)."""
    by = {(row.target, row.tenant): row for row in table}
    alone = by.get(("fleet-alone", INTERACTIVE.name))
    unloaded = alone.ttft[1] if alone else None
    out: list[Check] = []
    for target in dict.fromkeys(row.target for row in table):
        if target == "fleet-alone":
            continue
        p90 = by[(target, INTERACTIVE.name)].ttft[1]
        bound = None if unloaded is None else unloaded + SERVICE_S
        out.append(
            Check(
                target,
                "interactive TTFT p90 under the flood",
                f"{_s(p90)} s" + (f" ({p90 / unloaded:.1f}x unloaded)" if p90 and unloaded else ""),
                f"≤ unloaded p90 {_s(unloaded)} + one service time {SERVICE_S:g} s",
                None if bound is None or p90 is None else p90 <= bound,
            )
        )
        shares = _shares([row for row in table if row.target == target])
        off = {name: share / _weight_share(name) - 1 for name, share in shares.items()}
        out.append(
            Check(
                target,
                "batch tenants' shares of engine time",
                ", ".join(f"{name} {100 * shares[name]:.1f} %" for name in shares) or "—",
                f"within {100 * SHARE_TOLERANCE:.0f} % of the weights' "
                + ", ".join(f"{100 * _weight_share(t.name):.1f} %" for t in BATCH),
                all(abs(x) <= SHARE_TOLERANCE for x in off.values()) if off else None,
            )
        )
        capped = by[(target, CAPPED.name)]
        limit = CAPPED.tokens_per_minute
        over = capped.tokens_per_min / limit - 1
        out.append(
            Check(
                target,
                f"{CAPPED.name}: served tokens per minute",
                f"{capped.tokens_per_min:,.0f} ({100 * over:+.1f} %)"
                + (" (its limit not yet steady)" if target in unsteady else ""),
                f"within {100 * LIMIT_TOLERANCE:.0f} % of {limit:,}",
                None if target in unsteady else abs(over) <= LIMIT_TOLERANCE,
            )
        )
        shed = by[(target, SHEDDABLE.name)]
        at_once = shed.refusal_p99_s is not None and shed.refusal_p99_s <= SHED_AT_ONCE_S
        only_429 = set(shed.refused) <= {429}
        out.append(
            Check(
                target,
                f"{SHEDDABLE.name} while the fleet is saturated",
                f"{shed.served} served, refused {_statuses(shed.refused)}, "
                f"refusal p99 {_s(shed.refusal_p99_s)} s",
                f"none served, every one refused at once (429 within {SHED_AT_ONCE_S:g} s)",
                shed.sent > 0 and shed.served == 0 and shed.lost == 0 and at_once and only_429,
            )
        )
        out.append(
            Check(
                target,
                "requests lost (no answer, dropped, cut), every run",
                str(lost_anywhere.get(target, 0)),
                "0",
                lost_anywhere.get(target, 0) == 0,
            )
        )
    return out


def render_checks(found: Sequence[Check]) -> str:
    lines = ["| target | check | measured | target | result |", "|---|---|---|---|---|"]
    for check in found:
        lines.append(
            f"| {check.target} | {check.what} | {check.measured} | {check.wanted} "
            f"| {_verdict(check.passed)} |"
        )
    return "\n".join(lines)


def summary(table: Sequence[TenantRow]) -> str:
    """Interactive TTFT p90 of every target beside the unloaded one, in one sentence each."""
    interactive = {row.target: row.ttft[1] for row in table if row.tenant == INTERACTIVE.name}
    unloaded = interactive.get("fleet-alone")
    lines = []
    for target, p90 in interactive.items():
        times = f" = {p90 / unloaded:.1f}x unloaded" if p90 and unloaded else ""
        lines.append(f"- {target}: interactive TTFT p90 {_s(p90)} s{times}")
    return "\n".join(lines)


def offered(flood: float) -> float:
    """Offered load in multiples of capacity: the interactive tenant's plus the flood's."""
    return INTERACTIVE.rate_rps / CAPACITY_RPS + flood


def render_points(measured: Sequence[Measured]) -> str:
    lines = [
        "| target | flood (x capacity) | offered load (x capacity) | interactive served "
        "| refused | lost | TTFT p50 s | TTFT p90 s | TTFT p99 s | engines' queue mean (max) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for each in measured:
        for flood, traffic in sorted(each.points.items()):
            low, high = traffic.measured
            row = tenant_row(
                each.target.name, INTERACTIVE.name, traffic.window("interactive"), high - low
            )
            queue = (
                f"{statistics.fmean(traffic.waiting):.1f} ({max(traffic.waiting)})"
                if traffic.waiting
                else "—"
            )
            p50, p90, p99 = row.ttft
            lines.append(
                f"| {each.target.name} | {flood:g} | {offered(flood):.1f} | {row.served} "
                f"| {sum(row.refused.values())} | {row.lost} | {_s(p50)} | {_s(p90)} | {_s(p99)} "
                f"| {queue} |"
            )
    return "\n".join(lines)


def plot(measured: Sequence[Measured], paths: Sequence[Path]) -> None:
    """Interactive TTFT p90 against offered load, one line per target, to every path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5), dpi=110)
    unloaded = None
    for each in measured:
        points = []
        for flood, traffic in sorted(each.points.items()):
            low, high = traffic.measured
            p90 = tenant_row("", "", traffic.window(INTERACTIVE.name), high - low).ttft[1]
            if p90 is not None:
                points.append((offered(flood), p90))
        if each.target.alone and points:
            unloaded = points[0][1]
            axes.plot(*points[0], "k*", label=f"{each.target.name} (no flood)", markersize=9)
        elif points:
            axes.plot(*zip(*points, strict=True), "-o", label=each.target.name, markersize=4)
    if unloaded is not None:
        axes.axhline(unloaded, color="k", linestyle=":", label="fleet alone (unloaded p90)")
        axes.axhline(
            unloaded + SERVICE_S, color="k", linestyle="--", label="target: unloaded + service time"
        )
    axes.set_xlabel(f"offered load (x the fleet's capacity of {CAPACITY_RPS:g} req/s)")
    axes.set_ylabel("interactive tenant's TTFT p90 (s)")
    axes.set_yscale("log")
    axes.set_xlim(left=0)
    axes.set_title("Overload: the interactive tenant's TTFT p90 as batch floods the fleet")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    for path in paths:
        figure.savefig(path)
    plt.close(figure)
