"""The report: one column per router, the checks on headcount, and what went wrong, by stream.

The table's rows say what each number is and where it comes from; `checks`
holds the verdict the exit code follows (bench/resume/__init__.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.resume.measure import percentile
from bench.resume.run import Measured
from bench.resume.signals import Histogram
from bench.resume.targets import HEADCOUNT

__all__ = ["SEAM_P99_LIMIT_S", "Check", "checks", "render"]

SEAM_P99_LIMIT_S = 1.0
_SHOWN = 10


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds == float("inf"):
        return "∞"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _p50_p99(values: Sequence[float]) -> str:
    if not values:
        return "—"
    return f"{_ms(percentile(values, 50))} / {_ms(percentile(values, 99))} (n={len(values)})"


def _p50_max(values: Sequence[float], of: int) -> str:
    if not values:
        return f"— (0 of {of} crashes)"
    return f"{_ms(percentile(values, 50))} / {_ms(max(values))} ({len(values)} of {of} crashes)"


def _histogram(found: Histogram | None) -> str:
    if found is None or found.count <= 0:
        return "—" if found is None else "empty"
    return (
        f"n={found.count:g}, mean {_ms(found.mean)}, p50 ≤ {_ms(found.quantile(0.5))}, "
        f"p99 ≤ {_ms(found.quantile(0.99))}"
    )


def _refused(measured: Measured) -> str:
    if measured.resumes is None:
        return "n/a"
    refused = {
        outcome.removeprefix("refused_"): count
        for outcome, count in sorted(measured.resumes.items())
        if outcome.startswith("refused_") and count
    }
    return ", ".join(f"{reason} {count}" for reason, count in refused.items()) or "0"


def _resumes(measured: Measured) -> str:
    if measured.resumes is None:
        return "n/a"
    counts = measured.resumes
    return f"{counts['resumed']} resumed, {counts['failed']} failed, {counts['retried']} retried"


def _headcount(m: Measured, value: Callable[[Measured], str]) -> str:
    return value(m) if m.target.headcount else "n/a"


_Row = tuple[str, Callable[[Measured], str]]
_ROWS: tuple[_Row, ...] = (
    ("streams started", lambda m: str(len(m.tally.streams))),
    (
        "completed intact (`[DONE]`, text = the uninterrupted answer)",
        lambda m: str(m.tally.intact),
    ),
    ("completed with wrong text", lambda m: str(len(m.tally.wrong))),
    (
        "resumed (streams; router's access log, `outcome=resumed`)",
        lambda m: _headcount(m, lambda h: str(len(h.tally.resumed))),
    ),
    ("resumes (router's `headcount_stream_resumes_total`)", _resumes),
    ("cut (200, then broken: the client saw it)", lambda m: str(len(m.tally.cut))),
    ("failed (no 200)", lambda m: str(len(m.tally.failed))),
    ("refused, by reason (`refused_*` counter)", _refused),
    (
        "seam gap p50 / p99 (client: resumed streams' largest gap between events)",
        lambda m: _headcount(m, lambda h: _p50_p99(h.tally.seam_gaps)),
    ),
    (
        "seam gap, router's histogram (`headcount_stream_resume_gap_seconds`, bucket bounds)",
        lambda m: _headcount(m, lambda h: _histogram(h.seam_histogram)),
    ),
    (
        "largest gap of the other completed streams p50 / p99 (the jitter of any stream)",
        lambda m: _p50_p99(m.tally.other_gaps),
    ),
    (
        "kill → router's first line about a stream on that engine, p50 / max",
        lambda m: _headcount(m, lambda h: _p50_max(h.tally.times("detect"), len(h.crashes))),
    ),
    (
        "kill → first stream the client saw cut, p50 / max",
        lambda m: _p50_max(m.tally.times("to_break"), len(m.crashes)),
    ),
    (
        "kill → first event after a resumed stream's seam, p50 / max",
        lambda m: _headcount(m, lambda h: _p50_max(h.tally.times("to_seam_end"), len(h.crashes))),
    ),
)


def checks(measured: Sequence[Measured]) -> list[Check]:
    """The verdict on headcount with resume on; failing when it was not measured."""
    found = [m for m in measured if m.target.name == HEADCOUNT]
    if not found:
        return [Check(f"{HEADCOUNT} measured", False, "not measured")]
    tally = found[0].tally
    p99 = percentile(tally.seam_gaps, 99)
    return [
        Check(
            "every completed stream has the uninterrupted text",
            not tally.wrong,
            f"{len(tally.wrong)} wrong of {tally.intact + len(tally.wrong)}",
        ),
        Check(
            "no stream cut but those the router refused to resume, with a reason",
            not tally.unexplained_cuts,
            f"{len(tally.unexplained_cuts)} cut without a reason; refused: "
            + (", ".join(f"{r} {n}" for r, n in tally.cut_reasons.most_common()) or "none"),
        ),
        Check("some stream was resumed", bool(tally.resumed), f"{len(tally.resumed)} resumed"),
        Check(
            f"seam gap p99 under {SEAM_P99_LIMIT_S:g} s",
            p99 is not None and p99 < SEAM_P99_LIMIT_S,
            _ms(p99),
        ),
    ]


def _gist(error: str) -> str:
    """An error without its specifics (counts, ids), to count alike ones together; a status
    keeps the start of its body (what the router says)."""
    if error[:3].isdigit():
        return error[:72]
    return error.split(" after ")[0].split(":")[0][:60]


def _answered(m: Measured, window_s: float = 10.0) -> str:
    """Streams that got a 200, by when they began: an outage shows as a run of zeros."""
    begun = [(s.started - m.t0, s.status == 200) for s in m.tally.streams]
    counts = Counter(int(at // window_s) for at, ok in begun if ok)
    last = int(max((at for at, _ in begun), default=0.0) // window_s)
    return " ".join(str(counts[n]) for n in range(last + 1))


def _details(m: Measured) -> list[str]:
    t, t0 = m.tally, m.t0
    lines = [f"### {m.target.name}", ""]
    lines += [f"- note: {note}" for note in m.notes]
    for stream, difference in t.wrong[:_SHOWN]:
        lines.append(f"- wrong text: `{stream.request_id}`: {difference}")
    shown_cuts = t.unexplained_cuts if m.target.resumes else t.cut
    label = "cut, no refusal logged" if m.target.resumes else "cut"
    for stream in shown_cuts[:_SHOWN]:
        lines.append(
            f"- {label}: `{stream.request_id}` at +{stream.ended - t0:.2f} s after "
            f"{stream.events} events: {stream.error[:160]}"
        )
    if len(shown_cuts) > _SHOWN:
        lines.append(f"- ... and {len(shown_cuts) - _SHOWN} more cut")
    lines.append(f"- streams answered 200, by start, per 10 s: {_answered(m)}")
    errors = Counter(_gist(s.error) for s in t.cut + t.failed)
    if errors:
        lines.append(
            "- how streams broke or failed: "
            + "; ".join(f"{n} x {kind}" for kind, n in errors.most_common(6))
        )
    lines += ["", "| crash | engine | back after | broken | detect | first cut | first seam end |"]
    lines.append("|---|---|---|---|---|---|---|")
    for timing in t.crashes:
        crash = timing.crash
        lines.append(
            f"| +{crash.killed - t0:.1f} s | {crash.engine} | "
            f"{crash.restarted - crash.killed:.1f} s | {timing.broken} | {_ms(timing.detect)} | "
            f"{_ms(timing.to_break)} | {_ms(timing.to_seam_end)} |"
        )
    return [*lines, ""]


def render(
    measured: Sequence[Measured],
    skipped: dict[str, str],
    verdict: Sequence[Check],
    setup: Sequence[str],
    started: str,
) -> str:
    """The whole report; `setup` the bullet lines saying what ran."""
    ok = all(check.ok for check in verdict)
    names = [m.target.name for m in measured]
    lines = [
        f"# Resuming broken streams, {started} UTC: "
        + ("all checks pass" if ok else "**a check failed**"),
        "",
        *setup,
        *(f"- {m.target.name}: {m.target.setup}" for m in measured),
        *(f"- {name} not measured: {why}" for name, why in skipped.items()),
        "",
        "| | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
        *(f"| {title} | {' | '.join(value(m) for m in measured)} |" for title, value in _ROWS),
        "",
        "How the times are measured: the seam gap is, at the client, a resumed stream's largest "
        "gap between two events (the router's access log says which were resumed, joined by "
        "`x-request-id`); kill-to-detect is from the SIGKILL to the router's first log line "
        "(resume, cut, or a cut stream's access line) about a stream on that engine, the log's "
        "times being whole milliseconds; the client's times are from the SIGKILL to the first "
        "stream it saw cut, and to the first event after a resumed stream's seam, each within "
        "the crash (until the engine answered again).",
        "",
        "## Checks (headcount, resume on)",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *(f"| {c.name} | {'ok' if c.ok else '**FAIL**'} | {c.detail} |" for c in verdict),
        "",
        "## Per router: what broke, and each crash",
        "",
    ]
    for m in measured:
        lines += _details(m)
    return "\n".join(lines)
