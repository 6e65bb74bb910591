"""The resume benchmark's verdicts rest on pure helpers: they are checked here, without I/O.

A stream is judged against the simulator's uninterrupted answer and joined with
the router's log by `x-request-id`; a crash is timed to the router's first line
about a stream on that engine; the crash schedule is the seed's alone and never
takes two engines down at once; the router's log and metrics are read back
from their text.
"""

from __future__ import annotations

import datetime
import json

import pytest

from bench.common.harness import BenchError
from bench.resume.chaos import Crash, schedule
from bench.resume.measure import expected_text, first_difference, tally
from bench.resume.signals import histogram, parse_log, resume_counts
from bench.resume.traffic import Stream

ENGINE_A = "http://127.0.2.1:8000"
ENGINE_B = "http://127.0.2.2:8000"
WALL = 1_800_000_000.0
"""The wall clock at monotonic 0, in these tests."""


def _log_line(at: float, logger: str, message: str, **extra: object) -> str:
    """A line as headcount's JSON formatter writes it: `time` in UTC to the millisecond."""
    whole, millis = divmod(round(at * 1000), 1000)
    stamp = datetime.datetime.fromtimestamp(whole, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    document = {"time": f"{stamp}.{millis:03d}Z", "logger": logger, "message": message}
    return json.dumps({**document, **extra})


def _at(seconds: float) -> float:
    return WALL + seconds


def _stream(request_id: str, *, text: str | None = None, **fields: object) -> Stream:
    stream = Stream(request_id, f"Tell the story of stream {request_id}", started=0.0)
    stream.status, stream.done = 200, True
    stream.text = expected_text(stream, 8) if text is None else text
    for name, value in fields.items():
        setattr(stream, name, value)
    return stream


def test_the_expected_text_is_the_simulators_whole_answer_and_differs_per_prompt() -> None:
    one, two = _stream("0-1"), _stream("0-2")
    assert one.text.startswith(" ") and len(one.text) > 16
    assert one.text != two.text


def test_a_difference_is_located_at_its_first_character() -> None:
    assert "from char 4: got 'x'" in first_difference("abcdx", "abcde")
    assert "4 chars for 5; from char 4" in first_difference("abcd", "abcde")


def test_the_schedule_is_the_seeds_round_robin_and_leaves_room_to_restart() -> None:
    kills = schedule(7, 120.0, 10.0, (2.0, 4.0), 4)
    assert [k.at for k in kills] == [5.0 + 10 * n for n in range(12)]
    first = kills[0].engine
    assert [k.engine for k in kills] == [(first + n) % 4 for n in range(12)]
    assert all(2.0 <= k.down_s <= 4.0 for k in kills)
    assert kills == schedule(7, 120.0, 10.0, (2.0, 4.0), 4)
    assert [k.down_s for k in kills] != [k.down_s for k in schedule(8, 120.0, 10.0, (2.0, 4.0), 4)]


def test_a_down_time_that_would_overlap_the_next_crash_is_refused() -> None:
    with pytest.raises(BenchError):
        schedule(1, 20.0, 5.0, (2.0, 4.0), 4)


def test_the_log_gives_access_lines_resumes_and_cuts_by_request_id() -> None:
    text = "\n".join(
        [
            "$ headcount serve ...",
            _log_line(
                _at(5.003),
                "headcount.proxy.exchange",
                f"stream r1 for model 'sim-model' resumed on engine {ENGINE_B} after connection "
                "reset: 12 tokens carried over (resume 1 of at most 2)",
            ),
            _log_line(
                _at(5.004),
                "headcount.proxy.exchange",
                "stream r2 for model 'sim-model' cut, not resumed (limit): connection reset",
            ),
            _log_line(
                _at(5.9),
                "headcount.access",
                "",
                request_id="r1",
                outcome="resumed",
                engine=ENGINE_B,
                resumed_from=ENGINE_A,
            ),
            _log_line(
                _at(5.005),
                "headcount.access",
                "",
                request_id="r2",
                outcome="cut",
                engine=ENGINE_A,
                resumed_from=None,
            ),
        ]
    )
    log = parse_log(text)
    assert log.access["r1"].engines == {ENGINE_A, ENGINE_B}
    assert log.access["r2"].resumed_from == ()
    assert log.cut_reasons == {"r2": "limit"}
    kinds = [(e.request_id, e.kind, e.detail) for e in log.events]
    assert kinds == [
        ("r1", "resumed", ENGINE_B),
        ("r2", "cut", "limit"),
        ("r2", "access-cut", ""),
    ]
    assert log.events[0].at == pytest.approx(_at(5.003))


def test_streams_are_joined_with_the_log_and_each_crash_timed_from_its_kill() -> None:
    log = parse_log(
        "\n".join(
            [
                _log_line(
                    _at(5.0),  # 1 ms before the kill as the log writes it: counts, as 0
                    "headcount.proxy.exchange",
                    f"stream r1 for model 'm' resumed on engine {ENGINE_B} after reset: 3 tokens",
                ),
                _log_line(
                    _at(6.0),
                    "headcount.access",
                    "",
                    request_id="r1",
                    outcome="resumed",
                    engine=ENGINE_B,
                    resumed_from=ENGINE_A,
                ),
                _log_line(
                    _at(5.02),
                    "headcount.proxy.exchange",
                    "stream r3 for model 'm' cut, not resumed (no_engine): reset",
                ),
                _log_line(
                    _at(5.02),
                    "headcount.access",
                    "",
                    request_id="r3",
                    outcome="cut",
                    engine=ENGINE_A,
                ),
            ]
        )
    )
    resumed = _stream("r1", max_gap=0.25, gap_end=5.3)
    wrong = _stream("r2", text="not the answer", max_gap=0.04)
    cut = _stream("r3", done=False, error="payload", ended=5.03)
    unexplained = _stream("r4", done=False, error="ended after 3 events", ended=5.5)
    failed = _stream("r5", status=502, done=False)
    crash = Crash(0, ENGINE_A, killed=5.0005, restarted=8.0)
    other = Crash(1, ENGINE_B, killed=15.0, restarted=18.0)

    result = tally([resumed, wrong, cut, unexplained, failed], [crash, other], log, 8, WALL)

    assert result.intact == 1
    assert [s.request_id for s, _ in result.wrong] == ["r2"]
    assert [s.request_id for s in result.resumed] == ["r1"]
    assert [s.request_id for s in result.cut] == ["r3", "r4"]
    assert [s.request_id for s in result.unexplained_cuts] == ["r4"]
    assert result.cut_reasons == {"no_engine": 1}
    assert [s.request_id for s in result.failed] == ["r5"]
    assert result.seam_gaps == [0.25]
    assert result.other_gaps == [0.04]
    first, second = result.crashes
    assert first.detect == 0.0
    assert first.to_break == pytest.approx(0.0295)
    assert first.to_seam_end == pytest.approx(0.2995)
    assert first.broken == 3
    assert (second.detect, second.to_break, second.to_seam_end, second.broken) == (
        None,
        None,
        None,
        0,
    )
    assert result.times("detect") == [0.0]


def test_without_a_log_resumes_and_detection_are_unknown_and_no_cut_is_explained() -> None:
    cut = _stream("r1", done=False, error="ended", ended=5.2)
    result = tally([cut], [Crash(0, ENGINE_A, 5.0, 8.0)], None, 8, WALL)
    assert result.resumed == []
    assert result.unexplained_cuts == []
    assert result.crashes[0].detect is None
    assert result.crashes[0].to_break == pytest.approx(0.2)


METRICS = """\
# HELP headcount_stream_resumes_total Broken answers.
# TYPE headcount_stream_resumes_total counter
headcount_stream_resumes_total{model="sim-model",outcome="resumed"} 40.0
headcount_stream_resumes_total{model="other",outcome="resumed"} 2.0
headcount_stream_resumes_total{model="sim-model",outcome="refused_limit"} 3.0
headcount_stream_resumes_total_created{model="sim-model",outcome="resumed"} 1.7e9
headcount_stream_resume_gap_seconds_bucket{le="0.01",model="sim-model"} 10.0
headcount_stream_resume_gap_seconds_bucket{le="0.025",model="sim-model"} 35.0
headcount_stream_resume_gap_seconds_bucket{le="0.05",model="sim-model"} 39.0
headcount_stream_resume_gap_seconds_bucket{le="+Inf",model="sim-model"} 40.0
headcount_stream_resume_gap_seconds_count{model="sim-model"} 40.0
headcount_stream_resume_gap_seconds_sum{model="sim-model"} 0.8
"""


def test_the_resume_counter_is_read_by_outcome_summed_over_models() -> None:
    assert resume_counts(METRICS) == {"resumed": 42, "refused_limit": 3}


def test_the_histogram_bounds_each_quantile_by_its_bucket() -> None:
    seams = histogram(METRICS, "headcount_stream_resume_gap_seconds")
    assert seams.count == 40
    assert seams.mean == pytest.approx(0.02)
    assert seams.quantile(0.25) == 0.01
    assert seams.quantile(0.5) == 0.025
    assert seams.quantile(0.99) == float("inf")
    assert histogram("", "headcount_stream_resume_gap_seconds").quantile(0.5) is None
