"""The overhead suite's report: medians over rounds per target and workload, and ratios."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common.peers import peer_versions
from bench.overhead.run import Sample, Settings, WorkloadResult
from bench.overhead.targets import ENGINES

__all__ = ["render"]


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or not denominator:
        return "—"
    return f"{numerator / denominator:.2f}"


@dataclass(frozen=True)
class _Summary:
    ok_per_s: float | None
    low: float | None
    high: float | None
    p50_ms: float | None
    p99_ms: float | None
    non_2xx: int
    socket_errors: int
    router_us: float | None
    gateway_us: float | None
    engines_us: float | None
    split: str
    """Each engine's share of the responses, in percent, over all rounds."""


def _split(samples: Sequence[Sample]) -> str:
    counts = [sample.served for sample in samples]
    if not counts or any(count is None for count in counts):
        return "—"
    totals = [sum(column) for column in zip(*(count for count in counts if count), strict=True)]
    whole = sum(totals)
    return "/".join(f"{100 * total / whole:.0f}" for total in totals) if whole else "—"


def _summarise(samples: Sequence[Sample]) -> _Summary:
    rates = [sample.wrk.ok_per_s for sample in samples]
    return _Summary(
        ok_per_s=_median(rates),
        low=min(rates, default=None),
        high=max(rates, default=None),
        p50_ms=_median([sample.wrk.p50_ms for sample in samples]),
        p99_ms=_median([sample.wrk.p99_ms for sample in samples]),
        non_2xx=sum(sample.wrk.non_2xx for sample in samples),
        socket_errors=sum(sample.wrk.socket_errors for sample in samples),
        router_us=_median([sample.router_us for sample in samples]),
        gateway_us=_median([sample.gateway_us for sample in samples]),
        engines_us=_median([sample.engines_us for sample in samples]),
        split=_split(samples),
    )


_TABLE_HEAD = (
    "| target | 2xx req/s | min-max | p50 ms | p99 ms | non-2xx | socket err "
    "| router CPU µs/req | Envoy CPU µs/req | engines CPU µs/req | engine split % "
    "| req/s ÷ direct | router CPU ÷ vllm-router |\n"
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
)


def _workload_section(result: WorkloadResult) -> tuple[list[str], dict[str, _Summary]]:
    summaries = {entry.target.name: _summarise(entry.samples) for entry in result.measured}
    direct = summaries.get("direct")
    vllm = summaries.get("vllm-router")
    lines = [f"## {result.workload.title}", "", _TABLE_HEAD]
    for name, summary in summaries.items():
        lines.append(
            f"| {name} | {_fmt(summary.ok_per_s)} | {_fmt(summary.low)}-{_fmt(summary.high)} "
            f"| {_fmt(summary.p50_ms, 2)} | {_fmt(summary.p99_ms, 2)} | {summary.non_2xx} "
            f"| {summary.socket_errors} | {_fmt(summary.router_us)} | {_fmt(summary.gateway_us)} "
            f"| {_fmt(summary.engines_us)} "
            f"| {summary.split} "
            f"| {_ratio(summary.ok_per_s, direct.ok_per_s if direct else None)} "
            f"| {_ratio(summary.router_us, vllm.router_us if vllm else None)} |"
        )
    notes = [f"- {entry.target.name}: {entry.note}" for entry in result.measured if entry.note]
    notes += [f"- {name} not measured: {reason}" for name, reason in result.skipped.items()]
    if notes:
        lines += ["", *notes]
    return lines, summaries


def _difference(minuend: _Summary | None, subtrahend: _Summary | None) -> str:
    if minuend is None or subtrahend is None:
        return "—"
    if minuend.router_us is None or subtrahend.router_us is None:
        return "—"
    return f"{minuend.router_us - subtrahend.router_us:+,.1f}"


def _ratios_section(all_summaries: dict[str, dict[str, _Summary]]) -> list[str]:
    lines = [
        "## headcount ratios (medians)",
        "",
        "| workload | req/s ÷ direct | req/s ÷ vllm-router | router CPU µs/req ÷ vllm-router "
        "| router CPU µs/req: headcount-tenants minus headcount | the same minus headcount-keys |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for workload, summaries in all_summaries.items():
        ours = summaries.get("headcount")
        direct, vllm = summaries.get("direct"), summaries.get("vllm-router")
        tenants, keys = summaries.get("headcount-tenants"), summaries.get("headcount-keys")
        lines.append(
            f"| {workload} "
            f"| {_ratio(ours.ok_per_s if ours else None, direct.ok_per_s if direct else None)} "
            f"| {_ratio(ours.ok_per_s if ours else None, vllm.ok_per_s if vllm else None)} "
            f"| {_ratio(ours.router_us if ours else None, vllm.router_us if vllm else None)} "
            f"| {_difference(tenants, ours)} | {_difference(tenants, keys)} |"
        )
    return lines


def _tool_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    words = (done.stdout or done.stderr).split()
    return " ".join(words[:2]) or "unknown"


def render(
    results: Sequence[WorkloadResult], settings: Settings, started: str, log_dir: Path
) -> str:
    header = [
        f"# Router overhead, {started} UTC",
        "",
        f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        f"- load: {_tool_version(['wrk', '-v'])}; {settings.threads} threads, keep-alive, "
        f"{settings.rounds} rounds x {settings.duration_s} s per target, interleaved, "
        f"order rotated per round; warm-up {settings.warmup_s} s per target and workload",
        f"- engines: {ENGINES} x `{settings.engine_cmd}`, token delay {settings.token_delay_s} s",
        f"- peers: {peer_versions()}",
        f"- logs: {settings.out_dir.name}/{log_dir.name}/",
        "- medians over rounds; errors summed over rounds; CPU per 2xx response; "
        "method in bench/overhead/__init__.py",
        "",
    ]
    body: list[str] = []
    all_summaries: dict[str, dict[str, _Summary]] = {}
    for result in results:
        lines, summaries = _workload_section(result)
        body += [*lines, ""]
        all_summaries[result.workload.name] = summaries
    return "\n".join(header + body + _ratios_section(all_summaries)) + "\n"
