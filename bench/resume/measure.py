"""One router's run judged: every stream against its uninterrupted answer, joined with the
router's own account of it, and the times from each crash to its first sign.

Pure: the streams, crashes and router signals in, a `Tally` out. Times: the
streams and crashes are `time.monotonic()`, the router's log the wall clock;
`wall_offset` (wall minus monotonic, read once at the run's start) joins them.

- intact: ended with `[DONE]` and its text equals `answer_text(body, "chat",
  max_tokens)`; wrong: ended with `[DONE]`, another text (`first_difference`).
- resumed: the router's access log says `outcome=resumed` (headcount only).
- seam gap: a resumed stream's largest gap between two events, at the client.
- kill-to-detect (router): from the SIGKILL to the first router line about a
  stream on that engine (resumed, cut, or an access line of a cut stream),
  within the crash (until the engine is back). The log's times are whole
  milliseconds, cut down: a line up to 1 ms before the kill counts, as 0.
- kill-to-break (client): from the SIGKILL to the first stream the client saw
  cut, within the crash; kill-to-seam-end: to the first event after the seam of a
  stream resumed from that engine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.hostile.report import percentile
from bench.resume.chaos import Crash
from bench.resume.signals import RouterLog
from bench.resume.traffic import Stream, request_body
from headcount.sim.engine import answer_text

__all__ = [
    "LOG_SLACK_S",
    "CrashTiming",
    "Tally",
    "expected_text",
    "first_difference",
    "percentile",
    "tally",
]

LOG_SLACK_S = 0.001
"""The log's resolution: its times are cut down to the millisecond."""


def expected_text(stream: Stream, max_tokens: int) -> str:
    """What an uninterrupted engine answers the stream's request with."""
    return answer_text(request_body(stream.prompt, max_tokens), "chat", max_tokens)


def first_difference(got: str, expected: str) -> str:
    """Where `got` leaves `expected`, in a few words."""
    at = next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )
    return (
        f"{len(got)} chars for {len(expected)}; from char {at}: got {got[at : at + 40]!r}, "
        f"expected {expected[at : at + 40]!r}"
    )


@dataclass
class Tally:
    streams: list[Stream]
    intact: int = 0
    wrong: list[tuple[Stream, str]] = field(default_factory=list)
    cut: list[Stream] = field(default_factory=list)
    failed: list[Stream] = field(default_factory=list)
    resumed: list[Stream] = field(default_factory=list)
    """Streams the router's access log says were resumed (a stream resumed twice counts once)."""
    unexplained_cuts: list[Stream] = field(default_factory=list)
    """Cut streams the router's log gives no refusal reason for (headcount only)."""
    seam_gaps: list[float] = field(default_factory=list)
    other_gaps: list[float] = field(default_factory=list)
    """Largest gaps of the completed streams not resumed: the jitter any stream has."""
    crashes: list[CrashTiming] = field(default_factory=list)
    cut_reasons: Counter[str] = field(default_factory=Counter)

    def times(self, name: str) -> list[float]:
        """One of `CrashTiming`'s times over the crashes that have it."""
        found = (getattr(crash, name) for crash in self.crashes)
        return [value for value in found if value is not None]


@dataclass(frozen=True)
class CrashTiming:
    """One crash's first signs, in seconds after the SIGKILL (None: none seen)."""

    crash: Crash
    detect: float | None
    """The router's first line about a stream on the engine (headcount only)."""
    to_break: float | None
    """The first stream the client saw cut."""
    to_seam_end: float | None
    """The first event after the seam of a stream resumed from the engine."""
    broken: int
    """Streams that broke (cut or resumed) while the engine was down."""


def _first_after(times: Sequence[float], start: float, end: float) -> float | None:
    within = [t - start for t in times if start - LOG_SLACK_S <= t <= end]
    return max(0.0, min(within)) if within else None


def tally(
    streams: Sequence[Stream],
    crashes: Sequence[Crash],
    log: RouterLog | None,
    max_tokens: int,
    wall_offset: float,
) -> Tally:
    """Judge every stream and time every crash; `log` None for a router whose log is not
    read (its resumes, refusals and detection are then unknown, not zero)."""
    result = Tally(list(streams))
    access = log.access if log is not None else {}
    for stream in streams:
        line = access.get(stream.request_id)
        if line is not None and line.outcome == "resumed":
            result.resumed.append(stream)
            result.seam_gaps.append(stream.max_gap)
        kind = stream.kind
        if kind == "failed":
            result.failed.append(stream)
        elif kind == "cut":
            result.cut.append(stream)
            if log is not None:
                reason = log.cut_reasons.get(stream.request_id)
                if reason is None:
                    result.unexplained_cuts.append(stream)
                else:
                    result.cut_reasons[reason] += 1
        else:
            expected = expected_text(stream, max_tokens)
            if stream.text == expected:
                result.intact += 1
            else:
                result.wrong.append((stream, first_difference(stream.text, expected)))
            if line is None or line.outcome != "resumed":
                result.other_gaps.append(stream.max_gap)
    result.crashes = [_time_crash(result, crash, log, wall_offset) for crash in crashes]
    return result


def _time_crash(
    result: Tally, crash: Crash, log: RouterLog | None, wall_offset: float
) -> CrashTiming:
    start, end = crash.killed, crash.restarted
    breaks = [s.ended for s in result.cut]
    to_break = _first_after(breaks, start, end)
    broken = sum(1 for t in breaks if start <= t <= end)
    if log is None:
        return CrashTiming(crash, None, to_break, None, broken)
    on_engine = {request_id for request_id, line in log.access.items() if crash.url in line.engines}
    seam_ends = [s.gap_end for s in result.resumed if s.request_id in on_engine]
    broken += sum(1 for t in seam_ends if start <= t <= end)
    lines = [e.at - wall_offset for e in log.events if e.request_id in on_engine]
    return CrashTiming(
        crash,
        _first_after(lines, start, end),
        to_break,
        _first_after(seam_ends, start, end),
        broken,
    )
