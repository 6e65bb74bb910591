"""Which engine's `/tokenize` is asked: candidates in turn, one that failed left alone a while.

Time is a `FakeClock`; the back-offs are read from when an engine is chosen again.
"""

from __future__ import annotations

from headcount.routing.kv.tokenize_turns import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    STALLED_AFTER,
    TokenizeTurns,
)
from tests.support import FakeClock, engine

A, B, C = engine("a"), engine("b"), engine("c")


def chosen(turns: TokenizeTurns, count: int) -> list[str | None]:
    picks = [turns.choose([A, B, C]) for _ in range(count)]
    return [None if pick is None else pick.id for pick in picks]


def test_candidates_take_turns_whatever_load_they_report() -> None:
    idle = engine("idle")  # reports no load at all
    busy = engine("busy", in_flight=50, waiting=9)
    turns = TokenizeTurns(FakeClock())
    picks = [turns.choose([idle, busy]) for _ in range(6)]
    assert sorted(pick.id for pick in picks if pick is not None) == ["busy"] * 3 + ["idle"] * 3


def test_a_failed_engine_is_skipped_for_a_back_off_that_doubles_up_to_the_most() -> None:
    clock = FakeClock()
    turns = TokenizeTurns(clock)
    backoffs = []
    for _ in range(6):
        turns.failed(A)
        assert "a" not in chosen(turns, 6)
        waited = 0.0
        while "a" not in chosen(turns, 3):
            clock.advance(1.0)
            waited += 1.0
        backoffs.append(waited)
    first = BACKOFF_FIRST
    assert backoffs == [first, 2 * first, 4 * first, 8 * first, BACKOFF_MAX, BACKOFF_MAX]


def test_after_its_back_off_one_request_tries_a_failed_engine_then_it_is_forgiven() -> None:
    clock = FakeClock()
    turns = TokenizeTurns(clock)
    turns.failed(A)
    clock.advance(BACKOFF_FIRST)
    picks = chosen(turns, 9)
    assert picks.count("a") == 1  # the others skip it while that one call is out
    turns.answered(A)
    assert chosen(turns, 9).count("a") == 3


def test_a_call_abandoned_by_its_client_neither_blames_nor_forgives() -> None:
    clock = FakeClock()
    turns = TokenizeTurns(clock)
    turns.failed(A)
    clock.advance(BACKOFF_FIRST)
    assert chosen(turns, 3).count("a") == 1
    turns.abandoned(A)
    assert chosen(turns, 3).count("a") == 1  # askable again, still on trial
    turns.failed(A)
    clock.advance(BACKOFF_FIRST)
    assert "a" not in chosen(turns, 3)  # its second failure in a row: twice the wait


def test_when_every_candidate_backs_off_none_is_asked() -> None:
    turns = TokenizeTurns(FakeClock())
    for each in (A, B, C):
        turns.failed(each)
    assert chosen(turns, 3) == [None] * 3
    assert turns.choose([]) is None


def answered_at_once(turns: TokenizeTurns, count: int, hung: str) -> list[str | None]:
    """`count` choices; each call answers at once but those to `hung`, which stay out."""
    picks = []
    for _ in range(count):
        pick = turns.choose([A, B, C])
        if pick is not None and pick.id != hung:
            turns.answered(pick)
        picks.append(None if pick is None else pick.id)
    return picks


def test_an_engine_whose_call_is_out_past_the_stall_bound_is_skipped_until_it_answers() -> None:
    clock = FakeClock()
    turns = TokenizeTurns(clock)
    assert answered_at_once(turns, 3, hung="a").count("a") == 1  # its call hangs
    clock.advance(STALLED_AFTER / 2)
    assert answered_at_once(turns, 6, hung="a").count("a") == 2  # slow is not stalled
    clock.advance(STALLED_AFTER / 2 + 0.001)
    assert "a" not in answered_at_once(turns, 6, hung="a")  # nothing from it: it stalls
    turns.answered(A)  # one of its three calls: it is moving again
    assert answered_at_once(turns, 6, hung="").count("a") == 2


def test_a_stalled_engine_is_asked_again_once_its_calls_end_without_a_failure() -> None:
    clock = FakeClock()
    turns = TokenizeTurns(clock)
    assert answered_at_once(turns, 3, hung="a").count("a") == 1
    clock.advance(STALLED_AFTER * 2)
    assert "a" not in answered_at_once(turns, 3, hung="a")
    turns.abandoned(A)
    assert answered_at_once(turns, 3, hung="").count("a") == 1


def test_when_every_candidate_stalls_none_is_asked() -> None:
    clock = FakeClock()
    turns = TokenizeTurns(clock)
    assert sorted(str(pick) for pick in chosen(turns, 3)) == ["a", "b", "c"]  # none answers
    clock.advance(STALLED_AFTER * 2)
    assert chosen(turns, 3) == [None] * 3


def test_engines_that_left_are_forgotten_but_not_one_with_calls_out() -> None:
    clock = FakeClock()
    turns = TokenizeTurns(clock)
    assert turns.choose([A]) is A  # its call hangs
    for number in range(1000):
        passing = engine(f"gone-{number}")
        assert turns.choose([passing]) is passing
        turns.answered(passing)
    assert len(turns._calls) <= 200
    clock.advance(STALLED_AFTER * 2)
    assert "a" not in chosen(turns, 3)
