"""Which engine's `/tokenize` is asked: candidates in turn, one that failed left alone a while.

Time is a `FakeClock`; the back-offs are read from when an engine is chosen again.
"""

from __future__ import annotations

from headcount.routing.kv.tokenize_turns import BACKOFF_FIRST, BACKOFF_MAX, TokenizeTurns
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
