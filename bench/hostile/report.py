"""A hostile run's records and their verdict: what a phase is, what it measured, the report.

The driver (bench/hostile/run.py) runs phases and fills a `PhaseRun` each; here every
run is summarised over its window (attack + aftermath) into a `Row`, judged
against issue 8's targets and, for phases h-m, issue 17's (the method and the
targets are in bench/hostile/__init__.py), and rendered as the markdown report.

Over 450 lines: a phase's records, its verdict and its lines in the report are
one concept per phase, and read side by side here (a phase's check beside the
figure it prints).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headcount.config import ProxySettings

__all__ = [
    "EVIL_MODEL",
    "SIM_MODEL",
    "Phase",
    "PhaseRun",
    "Row",
    "Sample",
    "Scale",
    "percentile",
    "render",
    "rss_allowances",
    "stalls_ms",
    "summarise",
]

SIM_MODEL = "sim-model"
EVIL_MODEL = "evil-model"
MIB = 1024 * 1024
BODY_LIMIT_MIB = ProxySettings().max_body_size / MIB
STALL_TARGET_MS = 20.0
P99_BUDGET_MS = 20.0
FD_SLACK = 5
HUNG_GRACE_S = 1.0
HELD_SLACK_MIB = 16.0
NEW_STALL_TARGET_MS = 50.0
"""Issue 17's phases: worst stall under 50 ms."""
KV_BYTES_PER_BLOCK = 64
"""Index memory allowed per block stored (j-kv-index): the wire costs ~6 bytes a block; the
router's own bound, once it has one, is what to compare with (its /engines view is shown)."""
HUNG_TOKENIZE_MS = 900.0
"""m-tokenize-hung: a chat this slow waited out the router's 1 s tokenize timeout."""


@dataclass(frozen=True)
class Phase:
    name: str
    title: str
    attack: str | None = None
    """The client-side attack in bench/hostile/programs/attacks.py, if any."""
    evil_mode: str | None = None
    """The adversarial engine's mode during the attack, if not `healthy`."""
    evil_model: str = EVIL_MODEL
    uploads: str = ""
    """The `Scale` field counting concurrent uploads (the RSS allowance), if any."""
    hold_evil: bool = False
    """Keep the engine's mode until the observer is done (a hung engine stays hung)."""
    keyed: bool = False
    """The router takes client keys (`--api-keys-file`) and has an `--admin-port`; the
    observer's chats carry a key, its `/livez` goes to the admin port."""
    kv: bool = False
    """`--routing kv-aware`, KV-event ports on the adversarial engine's address."""
    tokenizer: str | None = None
    """`--tokenizer`: the router's own (`builtin`: the simulator's, no files needed)."""
    big_prompts: bool = False
    """The observer also sends 200 KB chats (`Scale.big_rate`)."""
    min_attack_s: float = 0.0
    """An attack made of slow stages gets at least this long, even in a quick run."""
    stall_target_ms: float = STALL_TARGET_MS


@dataclass(frozen=True)
class Scale:
    warmup_s: float = 3.0
    attack_s: float = 10.0
    aftermath_s: float = 5.0
    json_clients: int = 4
    chunk_clients: int = 25
    chunk_waves: int = 4
    pipeline_connections: int = 4
    slowloris_connections: int = 500
    idle_connections: int = 2000
    evil_clients: int = 2
    client_timeout_s: float = 30.0
    rate: float = 50.0
    keyless_connections: int = 16
    parse_clients: int = 6
    unroutable_clients: int = 4
    unroutable_chats: int = 1500
    kv_frame_sizes_mib: tuple[float, ...] = (8.0, 32.0, 96.0)
    kv_blocks: int = 3_000_000
    big_rate: float = 4.0

    def attack_args(self, attack: str) -> list[str]:
        counts = {
            "wide-bodies": ("--clients", self.parse_clients),
            "keyless-heads": ("--connections", self.keyless_connections),
            "unroutable-chats": ("--clients", self.unroutable_clients),
            "kv-frames": ("--clients", 1),
            "kv-flood": ("--clients", 1),
            "kv-index": ("--clients", 1),
            "json-bodies": ("--clients", self.json_clients),
            "chunk-waves": ("--clients", self.chunk_clients),
            "pipeline": ("--connections", self.pipeline_connections),
            "slowloris": ("--connections", self.slowloris_connections),
            "idle": ("--connections", self.idle_connections),
            "evil-requests": ("--clients", self.evil_clients),
            "desync": ("--clients", self.evil_clients),
        }
        flag, value = counts[attack]
        sizes = ",".join(f"{size:g}" for size in self.kv_frame_sizes_mib)
        return [
            *(flag, str(value), "--waves", str(self.chunk_waves)),
            *("--count", str(self.unroutable_chats), "--sizes-mib", sizes),
            *("--blocks", str(self.kv_blocks)),
        ]

    def attack_seconds(self, phase: Phase) -> float:
        """The attack's length: a staged attack's at least what its stages need."""
        seconds = max(self.attack_s, phase.min_attack_s)
        if phase.attack == "kv-frames":
            # One frame of 2-byte blocks stalled main 0.4-1.3 s per MiB.
            seconds = max(seconds, 4 + 1.0 * sum(self.kv_frame_sizes_mib))
        return seconds


@dataclass(frozen=True)
class Sample:
    t: float
    rss_mib: float
    fds: int
    cpu_s: float = 0.0
    """CPU time of the router and its children so far."""


@dataclass
class PhaseRun:
    """What one phase produced; the report's row is computed from it by `summarise`."""

    phase: Phase
    t_attack: float
    t_stop: float
    t_end: float
    livez: list[tuple[float, float, bool]] = field(default_factory=list)
    normal: list[dict[str, Any]] = field(default_factory=list)
    big: list[dict[str, Any]] = field(default_factory=list)
    """The observer's 200 KB chats, if the phase sends them."""
    samples: list[Sample] = field(default_factory=list)
    attack_stats: dict[str, Any] = field(default_factory=dict)
    evil_stats: dict[str, Any] = field(default_factory=dict)
    evil_engine: dict[str, Any] | None = None
    """The adversarial engine as the router's `/engines` shows it at the end of the attack."""
    probe_error_after_s: float | None = None
    """Hung-engine phase: when `/engines` first showed a probe error for it, from the hang."""
    out_of_rotation_after_s: float | None = None
    """Hung-engine phase: when `/engines` first showed it unhealthy or ejected."""
    router_exit: int | None = None
    """The router's exit code if it died during the phase."""
    notes: list[str] = field(default_factory=list)


# --- the verdict ----------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of `values`; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def stalls_ms(livez: Sequence[tuple[float, float, bool]]) -> list[tuple[float, float]]:
    """When each `/livez` wait began and how long it took, a run of unanswered calls (each
    given up at the client timeout) counted as one wait, from the first call's start to the
    answer that ended it."""
    waits: list[tuple[float, float]] = []
    since: float | None = None
    for t, ms, answered in livez:
        if not answered:
            since = t if since is None else since
            continue
        waits.append((t, ms) if since is None else (since, (t - since) * 1000 + ms))
        since = None
    if since is not None:  # still unanswered when the observer stopped: at least this long
        t, ms, _ = livez[-1]
        waits.append((since, (t - since) * 1000 + ms))
    return waits


@dataclass(frozen=True)
class Row:
    worst_stall_ms: float | None
    p50_ms: float | None
    p99_ms: float | None
    normal_sent: int
    normal_failed: int
    rss_base_mib: float | None
    rss_peak_over_mib: float | None
    rss_after_over_mib: float | None
    fds_base: int | None
    fds_peak: int | None
    fds_after: int | None
    missed: tuple[str, ...]


def summarise(run: PhaseRun, quiet: Row | None, quiet_livez_ms: float | None, scale: Scale) -> Row:
    """One phase's row: its measurements over the window, judged against the targets."""
    window = (run.t_attack, run.t_end)
    livez = [ms for t, ms in stalls_ms(run.livez) if window[0] <= t < window[1]]
    normal = [r for r in run.normal if window[0] <= r["t"] < window[1]]
    failed = sum(1 for r in normal if r["st"] != 200 or r["err"])
    latencies = [float(r["ms"]) for r in normal]
    worst = max(livez) - (quiet_livez_ms or 0.0) if livez else None
    base = [s for s in run.samples if run.t_attack - 1.0 <= s.t < run.t_attack]
    during = [s for s in run.samples if window[0] <= s.t <= window[1]]
    tail = [s for s in run.samples if window[1] - 1.0 <= s.t <= window[1]]
    rss_base = _median([s.rss_mib for s in base])
    fds_base = int(statistics.median([s.fds for s in base])) if base else None
    peak_over = after_over = None
    if rss_base is not None and during:
        peak_over = max(s.rss_mib for s in during) - rss_base
    if rss_base is not None and tail:
        after_over = statistics.median([s.rss_mib for s in tail]) - rss_base
    fds_after = int(statistics.median([s.fds for s in tail])) if tail else None
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    row = Row(
        worst_stall_ms=worst,
        p50_ms=p50,
        p99_ms=p99,
        normal_sent=len(normal),
        normal_failed=failed,
        rss_base_mib=rss_base,
        rss_peak_over_mib=peak_over,
        rss_after_over_mib=after_over,
        fds_base=fds_base,
        fds_peak=max((s.fds for s in during), default=None),
        fds_after=fds_after,
        missed=(),
    )
    return dataclasses.replace(row, missed=_missed(run, row, quiet, scale))


def _uploads(run: PhaseRun, scale: Scale) -> int:
    return int(getattr(scale, run.phase.uploads)) if run.phase.uploads else 0


def rss_allowances(run: PhaseRun, scale: Scale) -> tuple[float, float]:
    """MiB over the baseline allowed at the peak and after the attack: twice the body limit
    per concurrent upload (one limit's worth twice without uploads) and one body limit after;
    an index that keeps what was stored (j-kv-index) may add its own memory bound as
    `/engines` shows it (`memory_limit_bytes`), or `KV_BYTES_PER_BLOCK` a block stored
    where it shows none, to both."""
    peak = 2 * BODY_LIMIT_MIB * max(1, _uploads(run, scale))
    after = BODY_LIMIT_MIB
    if run.phase.attack == "kv-index":
        bound = _index_bound(run)
        index = (bound or scale.kv_blocks * KV_BYTES_PER_BLOCK) / MIB
        peak, after = peak + index, after + index
    return peak, after


def _index_bound(run: PhaseRun) -> int | None:
    """The attacked index's memory bound in bytes, as the router's `/engines` showed it."""
    bound = (run.attack_stats.get("index when filled") or {}).get("memory_limit_bytes")
    return bound if isinstance(bound, int) and bound > 0 else None


def _missed(run: PhaseRun, row: Row, quiet: Row | None, scale: Scale) -> tuple[str, ...]:
    missed: list[str] = [] if run.router_exit is None else ["router died"]
    allowance, after_allowance = rss_allowances(run, scale)
    if row.worst_stall_ms is None or row.worst_stall_ms >= run.phase.stall_target_ms:
        missed.append("stall")
    quiet_p99 = quiet.p99_ms if quiet is not None else None
    if quiet_p99 is not None and (row.p99_ms is None or row.p99_ms > quiet_p99 + P99_BUDGET_MS):
        missed.append("p99")
    if row.rss_peak_over_mib is None or row.rss_peak_over_mib > allowance:
        missed.append("RSS peak")
    if row.rss_after_over_mib is None or row.rss_after_over_mib > after_allowance:
        missed.append("RSS after")
    if row.fds_after is None or row.fds_base is None or row.fds_after > row.fds_base + FD_SLACK:
        missed.append("fds after")
    if row.normal_failed:
        missed.append("failed requests")
    if any(_failed(r) for r in _in_window(run, run.big)):
        missed.append("failed 200 KB prompts")
    missed += _phase_check(run, row)
    return tuple(missed)


def _failed(record: dict[str, Any]) -> bool:
    return bool(record["st"] != 200 or record["err"])


def _in_window(run: PhaseRun, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if run.t_attack <= r["t"] < run.t_end]


def _phase_check(run: PhaseRun, row: Row) -> list[str]:
    name = run.phase.name
    if name == "h-keyless" and any(r["st"] == 503 for r in _in_window(run, run.normal)):
        return ["keyed requests answered 503"]
    if name == "m-tokenize-hung" and _waited_on_tokenize(run):
        return ["chats waited on a hung /tokenize"]
    if name == "b-chunks":
        held = max(run.attack_stats.get("body MiB sent per wave") or [0.0])
        if row.rss_peak_over_mib is None or row.rss_peak_over_mib > 2 * held + HELD_SLACK_MIB:
            return ["RSS per byte held"]
    if name == "f-desync" and run.attack_stats.get("desynced answers", 0):
        return ["desync"]
    if name == "f-nested" and (run.evil_engine or {}).get("state") == "ready":
        return ["probe error not a failure"]
    if name == "g-hung":
        waits = _hung_waits(run)
        if any(r["st"] != 200 or r["err"] for r in waits):
            return ["waits on a known-dead engine"]
        known = run.out_of_rotation_after_s
        if known is not None:
            out_at = run.t_attack + known
            if any(r["t"] + r["ms"] / 1000 > out_at + HUNG_GRACE_S for r in waits):
                return ["waits on a known-dead engine"]
    return []


def _during_attack(run: PhaseRun) -> list[dict[str, Any]]:
    return [r for r in run.normal if run.t_attack <= r["t"] < run.t_stop]


def _waited_on_tokenize(run: PhaseRun) -> list[dict[str, Any]]:
    return [r for r in _during_attack(run) if r["ms"] >= HUNG_TOKENIZE_MS]


def _hung_waits(run: PhaseRun) -> list[dict[str, Any]]:
    ids = set(run.evil_stats.get("hung_ids", ()))
    return [r for r in run.normal if r["id"] in ids]


# --- report -----------------------------------------------------------------------


def _f(value: float | None, digits: int = 1, sign: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _row_line(run: PhaseRun, row: Row, quiet: Row | None) -> str:
    quiet_lat = f"{_f(quiet.p50_ms)}/{_f(quiet.p99_ms)}" if quiet else "—"
    verdict = "yes" if not row.missed else "**no**: " + ", ".join(row.missed)
    return (
        f"| {run.phase.name} | {_f(row.worst_stall_ms)} "
        f"| {_f(row.p50_ms)}/{_f(row.p99_ms)} vs {quiet_lat} "
        f"| {_f(row.rss_peak_over_mib, sign=True)} (base {_f(row.rss_base_mib, 0)}) "
        f"| {_f(row.rss_after_over_mib, sign=True)} "
        f"| {row.fds_peak if row.fds_peak is not None else '—'}/"
        f"{row.fds_after if row.fds_after is not None else '—'} (base {row.fds_base}) "
        f"| {row.normal_failed} of {row.normal_sent} | {verdict} |"
    )


def _details(run: PhaseRun, scale: Scale) -> list[str]:
    lines = [f"- **{run.phase.name}** ({run.phase.title})"]
    stats = {k: v for k, v in run.attack_stats.items() if k != "marks"}
    if stats:
        lines.append(f"  - adversary saw: `{json.dumps(stats)}`")
    window = [(ms, ok) for t, ms, ok in run.livez if run.t_attack <= t < run.t_end]
    target = run.phase.stall_target_ms
    slow = sum(1 for ms, _ in window if ms >= target)
    lines.append(
        f"  - /livez answers of {target:g} ms or more: {slow} of {len(window)} "
        "(one alone can be the machine; many are the router)"
    )
    lines += _stage_lines(run)
    lines += _phase_lines(run)
    unanswered = sum(1 for _, ok in window if not ok)
    if unanswered:
        lines.append(
            f"  - {unanswered} /livez calls got no answer (connection refused, reset or timeout)"
        )
    engine = run.evil_engine
    if engine is not None and run.phase.evil_mode is not None:
        error = engine.get("last_error")
        lines.append(
            f"  - adversarial engine at the end of the attack: {engine.get('state')}"
            + (f" (`{str(error)[:160]}`)" if error else " (no error)")
        )
    if run.evil_stats.get("seen"):
        lines.append(f"  - adversarial engine was asked: `{json.dumps(run.evil_stats['seen'])}`")
    if run.phase.hold_evil:
        lines.append(f"  - {_hung_summary(run, scale)}")
    failures = [r for r in run.normal if r["t"] >= run.t_attack and (r["st"] != 200 or r["err"])]
    if failures:
        first = failures[0]
        lines.append(
            f"  - first failed normal request: {first['st'] or 'no answer'} after "
            f"{first['ms'] / 1000:.2f} s: `{first['err'][:120]}`"
        )
    lines += [f"  - {note}" for note in run.notes]
    return lines


def _rss_base(run: PhaseRun) -> float | None:
    return _median([s.rss_mib for s in run.samples if run.t_attack - 1.0 <= s.t < run.t_attack])


def _rss_near(run: PhaseRun, t: float) -> float | None:
    """The router's RSS around `t` (median of the samples within 0.5 s before it)."""
    return _median([s.rss_mib for s in run.samples if t - 0.5 <= s.t <= t])


def _marks(run: PhaseRun) -> list[tuple[str, float, float]]:
    """The attack's stages: label, start, end (the next stage's start, or the window's end)."""
    marks = [(str(label), float(t)) for label, t in run.attack_stats.get("marks", [])]
    if not marks:
        return []
    ends = [t for _, t in marks[1:]] + [run.t_end]
    return [(label, start, end) for (label, start), end in zip(marks, ends, strict=True)]


def _stage_lines(run: PhaseRun) -> list[str]:
    """Per stage of a staged attack: the slowest /livez, RSS at its end, the router's CPU."""
    base = _rss_base(run)
    lines = []
    waits = stalls_ms(run.livez)
    for label, start, end in _marks(run):
        livez = [ms for t, ms in waits if start <= t < end]
        cpu = [s for s in run.samples if start <= s.t <= end]
        cores = (
            (cpu[-1].cpu_s - cpu[0].cpu_s) / (cpu[-1].t - cpu[0].t)
            if len(cpu) > 1 and cpu[-1].t > cpu[0].t
            else None
        )
        rss = _rss_near(run, end)
        lines.append(
            f"  - stage `{label}` ({end - start:.1f} s): slowest /livez "
            f"{_f(max(livez) if livez else None)} ms, p99 {_f(percentile(livez, 99))} ms; "
            f"RSS at its end {_f(None if rss is None or base is None else rss - base, sign=True)}"
            f" MiB; router CPU {_f(cores, 2)} cores"
        )
    return lines


def _phase_lines(run: PhaseRun) -> list[str]:
    name, lines = run.phase.name, []
    if name == "h-keyless":
        refused = [r for r in _in_window(run, run.normal) if r["st"] == 503]
        lines.append(f"  - keyed chats answered 503 during the window: {len(refused)}")
    if run.phase.attack == "kv-index":
        lines += _per_million(run)
    if run.big:
        warm = [r["ms"] for r in run.big if r["t"] < run.t_attack and not _failed(r)]
        during = _in_window(run, run.big)
        ms = [r["ms"] for r in during]
        lines.append(
            f"  - 200 KB prompts: p50/p99 {_f(percentile(ms, 50))}/{_f(percentile(ms, 99))} ms "
            f"during ({len(ms)}, {sum(map(_failed, during))} failed) vs "
            f"{_f(percentile(warm, 50))}/{_f(percentile(warm, 99))} ms in the warm-up "
            f"({len(warm)})"
        )
    if name == "m-tokenize-hung":
        normal = _during_attack(run)
        waited = len(_waited_on_tokenize(run))
        share = 100 * waited / len(normal) if normal else 0.0
        lines.append(
            f"  - chats started while /tokenize hung that took {HUNG_TOKENIZE_MS:g} ms or more "
            f"(the tokenize timeout): {waited} of {len(normal)} ({share:.0f} %)"
        )
    return lines


def _per_million(run: PhaseRun) -> list[str]:
    filled = next((t for label, t, _ in _marks(run) if label == "filled"), None)
    blocks = (run.attack_stats.get("index when filled") or {}).get("blocks") or 0
    base = _rss_base(run)
    rss = None if filled is None else _rss_near(run, filled)
    if not blocks or rss is None or base is None:
        return ["  - RSS per million blocks: not measured (the index never filled)"]
    per_million = (rss - base) / (blocks / 1e6)
    bound = _index_bound(run)
    return [
        f"  - index filled with {blocks:,} blocks: RSS {rss - base:+.0f} MiB over the baseline, "
        f"{per_million:.0f} MiB per million blocks ({per_million * MIB / 1e6:.0f} bytes a block);"
        + (
            " the router shows no memory bound of its own"
            if bound is None
            else f" the router's own bound: {bound / MIB:.1f} MiB"
        )
    ]


def _hung_summary(run: PhaseRun, scale: Scale) -> str:
    waits = _hung_waits(run)
    error, out = run.probe_error_after_s, run.out_of_rotation_after_s
    ejected = (
        ("no probe error shown" if error is None else f"a probe error shown after {error:.1f} s")
        + "; "
        + ("never out of rotation" if out is None else f"out of rotation after {out:.1f} s")
        + " (from the hang, polled every 0.5 s)"
    )
    if not waits:
        return f"no normal request reached the hung engine; {ejected}"
    seconds = [r["ms"] / 1000 for r in waits]
    gave_up = sum(1 for r in waits if r["ms"] >= scale.client_timeout_s * 1000 - 50)
    answered = sum(1 for r in waits if r["st"] == 200 and not r["err"])
    return (
        f"{len(waits)} normal requests reached the hung engine; they took p50 "
        f"{_f(percentile(seconds, 50))} s, max {_f(max(seconds))} s; {answered} answered "
        f"(failed over), {gave_up} gave up at the client timeout "
        f"({scale.client_timeout_s:g} s); {ejected}"
    )


def render(
    runs: Sequence[PhaseRun],
    scale: Scale,
    started: str,
    log_dir: Path,
    source: str,
    probe_interval: float,
) -> str:
    quiet_run = next((run for run in runs if run.phase.name == "quiet"), None)
    quiet_livez = None
    quiet: Row | None = None
    if quiet_run is not None:
        window = [ms for t, ms, _ in quiet_run.livez if quiet_run.t_attack <= t < quiet_run.t_end]
        quiet_livez = _median(window)
        quiet = summarise(quiet_run, None, quiet_livez, scale)
    rows = [(run, summarise(run, quiet, quiet_livez, scale)) for run in runs]
    header = [
        f"# Hostile input, {started} UTC",
        "",
        f"- headcount: {source}; body limit {BODY_LIMIT_MIB:g} MiB (default), "
        f"probe interval {probe_interval:g} s, every other setting default",
        f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}; load at the end "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"- per phase: warm-up {scale.warmup_s:g} s, attack {scale.attack_s:g} s, aftermath "
        f"{scale.aftermath_s:g} s (window = attack + aftermath); normal traffic "
        f"{scale.rate:g}/s, client timeout {scale.client_timeout_s:g} s; /livez every 5 ms; "
        f"quiet /livez median {_f(quiet_livez, 2)} ms",
        f"- logs and raw samples: {log_dir}",
        f"- worst-stall target: {STALL_TARGET_MS:g} ms, {NEW_STALL_TARGET_MS:g} ms in issue 17's "
        f"phases (h-m); router memory bounds: peak RSS over the baseline <= 2 x the body limit "
        f"per concurrent upload ({2 * BODY_LIMIT_MIB:g} MiB without uploads), after the attack "
        f"<= {BODY_LIMIT_MIB:g} MiB; j-kv-index adds to both the index's own memory bound as "
        f"/engines shows it, else {KV_BYTES_PER_BLOCK} bytes per block stored "
        f"({scale.kv_blocks:,} blocks: {scale.kv_blocks * KV_BYTES_PER_BLOCK / MIB:.0f} MiB)",
        "- method and targets: the docstring of bench/hostile/__init__.py",
        "",
        "| phase | worst stall ms | normal p50/p99 ms during vs quiet "
        "| peak RSS MiB over baseline | RSS after | fds peak/after | failed normal requests "
        "| target met? |",
        "|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    body = [_row_line(run, row, quiet) for run, row in rows]
    details = ["", "## What each phase did and saw", ""]
    for run, _ in rows:
        details += _details(run, scale)
    return "\n".join(header + body + details) + "\n"
