"""The sliding window's arithmetic, and the in-process store on a fake clock.

The times a verdict promises are checked against the count they promise: at
`retry_after` the charge fits and a moment before it does not; at `reset` the
count is 0 and a moment before it is not. The Redis store's script is held to
the same verdicts in tests/process/test_limits_redis.py.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headcount.flow.limits import WINDOW, Charge, LimitsStore, Quota, StoreHealth
from headcount.flow.window import (
    Counts,
    MemoryStore,
    fits,
    judge,
    position,
    until_empty,
    until_fits,
    weighted,
)
from tests.support import FakeClock

__all__: list[str] = []

START = 1_700_000_040.0
"""A window's start (a multiple of 60), at a realistic Unix time."""
NONE = Counts(0, 0)


def later(counts: Counts, fraction: float, seconds: float) -> tuple[Counts, float]:
    """The counts and the fraction `seconds` on, nothing more charged."""
    elapsed = fraction * WINDOW + seconds
    windows = math.floor(elapsed / WINDOW)
    moved = (elapsed - windows * WINDOW) / WINDOW
    if windows == 0:
        return counts, moved
    if windows == 1:
        return Counts(counts.current, 0), moved
    return NONE, moved


def charge(rpm: int = 0, tpm: int = 0, tokens: int = 0, tenant: str = "t") -> Charge:
    return Charge(tenant, rpm, tpm, tokens)


# ---------------------------------------------------------------- the arithmetic


def test_position_is_the_window_and_how_far_into_it() -> None:
    assert position(START) == (START // 60, 0.0)
    assert position(START + 15) == (START // 60, 0.25)
    assert position(START + 60) == (START // 60 + 1, 0.0)


def test_the_previous_window_fades_as_the_current_one_goes_on() -> None:
    assert weighted(Counts(10, 3), 0.0) == 13
    assert weighted(Counts(10, 3), 0.25) == 10.5
    assert weighted(Counts(10, 3), 0.9) == pytest.approx(4)


def test_an_exact_fit_fits_and_one_more_does_not() -> None:
    assert fits(Counts(0, 9), 0.0, 1, 10)
    assert not fits(Counts(0, 10), 0.0, 1, 10)
    assert fits(Counts(10, 0), 0.5, 5, 10)
    assert not fits(Counts(10, 0), 0.5, 6, 10)


def test_a_limit_of_0_is_off() -> None:
    assert fits(Counts(10**9, 10**9), 0.0, 10**9, 0)


def test_until_fits_within_this_window_as_the_previous_one_fades() -> None:
    # 10 * (1 - f) + 5 <= 9 once f >= 0.6: 6 s after f = 0.5
    assert until_fits(Counts(10, 5), 0.5, 1, 10) == pytest.approx(6.0)


def test_until_fits_within_the_next_window_as_this_one_fades() -> None:
    # 10 at the window's start; 1 more fits once 10 * (1 - g) <= 9: 6 s into the next one
    assert until_fits(Counts(0, 10), 0.0, 1, 10) == pytest.approx(66.0)
    # the whole limit fits only once this window is gone: the end of the next one
    assert until_fits(Counts(0, 10), 0.0, 10, 10) == pytest.approx(120.0)


def test_until_empty_ends_with_the_last_window_that_counted() -> None:
    assert until_empty(Counts(4, 2), 0.25) == 105.0
    assert until_empty(Counts(4, 0), 0.25) == 45.0
    assert until_empty(NONE, 0.25) == 0.0


COUNT = st.integers(min_value=0, max_value=10**6)
FRACTION = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@given(COUNT, COUNT, FRACTION, st.integers(min_value=1, max_value=10**6), st.data())
def test_until_fits_is_the_moment_the_charge_fits(
    previous: int, current: int, fraction: float, limit: int, data: st.DataObject
) -> None:
    amount = data.draw(st.integers(min_value=0, max_value=limit))
    counts = Counts(previous, current)
    wait = until_fits(counts, fraction, amount, limit)
    assert fits(*later(counts, fraction, wait + 1e-6), amount, limit)
    if wait > 0:
        assert not fits(*later(counts, fraction, wait - 1e-3), amount, limit)


@given(COUNT, COUNT, FRACTION)
def test_until_empty_is_the_moment_the_count_is_0(
    previous: int, current: int, fraction: float
) -> None:
    counts = Counts(previous, current)
    wait = until_empty(counts, fraction)
    assert weighted(*later(counts, fraction, wait + 1e-6)) == 0
    if wait > 0:
        assert weighted(*later(counts, fraction, wait - 1e-3)) > 0


# ---------------------------------------------------------------- verdicts


def test_allowed_the_quotas_count_the_charge() -> None:
    verdict = judge(charge(10, 1000, 300), Counts(0, 4), Counts(0, 500), START + 30)
    assert verdict.allowed and verdict.reason == "" and verdict.retry_after == 0.0
    assert verdict.window == START // 60
    assert verdict.requests == Quota(10, 5, 90.0)
    assert verdict.tokens == Quota(1000, 200, 90.0)


def test_remaining_rounds_the_sliding_count_down() -> None:
    # 10 * 0.53 + 0 + 1 = 6.3 used of 10: 3 remain, not 3.7
    verdict = judge(charge(10), Counts(10, 0), NONE, START + 28.2)
    assert verdict.requests is not None and verdict.requests.remaining == 3


def test_limits_that_are_off_have_no_quota() -> None:
    verdict = judge(charge(0, 0, 10**9), Counts(10**9, 10**9), Counts(10**9, 10**9), START)
    assert verdict.allowed and verdict.requests is None and verdict.tokens is None


def test_over_requests_per_minute_says_when_to_retry() -> None:
    verdict = judge(charge(10, 1000, 1), Counts(0, 10), NONE, START)
    assert not verdict.allowed and verdict.reason == "requests_per_minute"
    assert verdict.retry_after == 66.0
    assert verdict.requests == Quota(10, 0, 120.0)
    assert verdict.tokens == Quota(1000, 1000, 0.0)


def test_over_tokens_per_minute_says_when_to_retry() -> None:
    verdict = judge(charge(10, 1000, 400), Counts(0, 1), Counts(0, 800), START)
    assert not verdict.allowed and verdict.reason == "tokens_per_minute"
    # 800 * (1 - g) + 400 <= 1000 once g >= 0.25: 15 s into the next window
    assert verdict.retry_after == 75.0
    assert verdict.requests == Quota(10, 9, 120.0)


def test_retry_after_waits_for_every_limit_to_have_room() -> None:
    # requests fit after 6 s into the next window; tokens only at its end
    verdict = judge(charge(10, 1000, 1000), Counts(0, 10), Counts(0, 1), START)
    assert verdict.reason == "requests_per_minute" and verdict.retry_after == 120.0


def test_a_charge_larger_than_the_limit_is_over_it_for_good() -> None:
    verdict = judge(charge(10, 1000, 1001), NONE, NONE, START)
    assert not verdict.allowed and verdict.reason == "tokens_over_limit"
    assert verdict.retry_after == 0.0
    assert verdict.tokens == Quota(1000, 1000, 0.0)


def test_times_are_rounded_up_to_the_millisecond() -> None:
    verdict = judge(charge(10), Counts(0, 10), NONE, START + 0.0006)
    assert verdict.retry_after == 66.0  # 65.9994 s
    assert verdict.requests is not None and verdict.requests.reset == 120.0  # 119.9994 s


# ---------------------------------------------------------------- the in-process store


def test_the_memory_store_meets_the_contract() -> None:
    store: LimitsStore = MemoryStore()
    assert store.health == StoreHealth("memory", True, None, 0)


def test_the_store_counts_allowed_charges_only() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock)
    verdicts = [store.take(charge(3, 100, 40)) for _ in range(3)]
    assert [v.allowed for v in verdicts] == [True, True, False]
    assert verdicts[2].reason == "tokens_per_minute"
    # the refusal counted nothing: a smaller charge still fits both limits exactly
    exact = store.take(charge(3, 100, 20))
    assert exact.allowed and exact.requests == Quota(3, 0, 120.0)
    assert exact.tokens == Quota(100, 0, 120.0)
    assert store.take(charge(3, 100, 0)).reason == "requests_per_minute"


def test_tenants_are_counted_apart() -> None:
    store = MemoryStore(FakeClock(START))
    assert store.take(charge(1, tenant="a")).allowed
    assert store.take(charge(1, tenant="b")).allowed
    assert not store.take(charge(1, tenant="a")).allowed


def test_the_count_slides_into_the_next_window() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock)
    for _ in range(10):
        store.take(charge(10))
    clock.advance(60 + 5)  # 10 * (1 - 1/12) = 9.17: no room yet
    refused = store.take(charge(10))
    assert refused.reason == "requests_per_minute" and refused.retry_after == 1.0
    clock.advance(refused.retry_after)
    assert store.take(charge(10)).allowed


def test_settle_gives_back_in_the_current_window() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock)
    reserved = store.take(charge(0, 1000, 900))
    assert not store.take(charge(0, 1000, 200)).allowed
    store.settle("t", reserved.window, -150)
    after = store.take(charge(0, 1000, 200))
    assert after.allowed and after.tokens == Quota(1000, 50, 120.0)


def test_settle_into_the_previous_window_counts_what_is_left_of_it() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock)
    reserved = store.take(charge(0, 1000, 800))
    clock.advance(60 + 30)  # the reservation's window is now the previous one, half gone
    store.settle("t", reserved.window, 200)  # 1000 * 0.5 = 500 counted
    assert store.take(charge(0, 1000, 500)).allowed
    assert not store.take(charge(0, 1000, 1)).allowed


def test_settle_into_an_older_window_does_nothing() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock)
    reserved = store.take(charge(0, 1000, 800))
    clock.advance(2 * 60)
    store.settle("t", reserved.window, 10**6)
    assert store.take(charge(0, 1000, 1000)).allowed


def test_settle_for_a_tenant_never_charged_is_harmless() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock)
    store.settle("new", position(START)[0], -10)
    assert store.take(charge(0, 10, 10, tenant="new")).allowed


def test_idle_tenants_are_forgotten() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock)
    for index in range(100):
        store.take(charge(10, tenant=f"t{index}"))
    clock.advance(60)
    store.take(charge(10, tenant="t0"))
    assert len(store) == 100  # the previous window still counts for every tenant
    clock.advance(60)
    store.take(charge(10, tenant="t0"))
    assert len(store) == 1
