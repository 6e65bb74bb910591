"""An index's trust as a pure function of what its stream and the router recorded, and the time."""

from __future__ import annotations

import pytest

from headcount.kvindex.trust import IndexTrust, TrustFacts, evaluate

__all__: list[str] = []

IDLE, WINDOW = 10.0, 30.0


def trust(facts: TrustFacts, now: float = 100.0) -> tuple[IndexTrust, str]:
    return evaluate(facts, now, idle_timeout=IDLE, rebuild_window=WINDOW)


def connected(**facts: object) -> TrustFacts:
    """Connected, and confirmed just now unless `facts` say otherwise."""
    return TrustFacts(  # type: ignore[arg-type]
        endpoint="tcp://e:5557",
        connected=True,
        ever_connected=True,
        **({"confirmed_at": 100.0, "confirmed_how": "batches in sequence"} | facts),
    )


def test_no_session_with_the_publisher_is_off_and_says_whether_it_ever_had_one() -> None:
    assert trust(TrustFacts("tcp://e:5557")) == (
        IndexTrust.OFF,
        "no publisher reached at tcp://e:5557",
    )
    lost = TrustFacts("tcp://e:5557", ever_connected=True, confirmed_at=100.0)
    assert trust(lost) == (IndexTrust.OFF, "lost the publisher at tcp://e:5557")


def test_a_confirmed_stream_with_nothing_amiss_is_synced_and_says_how_it_was_confirmed() -> None:
    assert trust(connected()) == (IndexTrust.SYNCED, "batches in sequence")


def test_a_session_nothing_has_confirmed_yet_is_off_and_says_what_it_waits_for() -> None:
    assert trust(connected(confirmed_at=None)) == (
        IndexTrust.OFF,
        "connected to tcp://e:5557, not yet confirmed: "
        "waiting for a batch or an answer to the liveness check",
    )
    failed = connected(confirmed_at=None, unconfirmed_why="no answer within 2s")
    assert trust(failed) == (
        IndexTrust.OFF,
        "connected to tcp://e:5557, not yet confirmed: no answer within 2s",
    )


def test_silence_alone_is_no_doubt_while_the_stream_is_confirmed() -> None:
    facts = connected(confirmed_at=100.0)
    assert trust(facts, 100.0 + IDLE - 0.1)[0] is IndexTrust.SYNCED


def test_a_stream_unconfirmed_for_the_idle_timeout_is_stale_until_confirmed_again() -> None:
    facts = connected(confirmed_at=100.0, unconfirmed_why="no answer within 2s")
    assert trust(facts, 100.0 + IDLE - 0.1)[0] is IndexTrust.SYNCED
    assert trust(facts, 100.0 + IDLE + 2) == (
        IndexTrust.STALE,
        "not confirmed for 12s: no answer within 2s",
    )
    stuck = connected(confirmed_at=100.0)
    assert trust(stuck, 100.0 + IDLE) == (
        IndexTrust.STALE,
        "not confirmed for 10s: no batch and no liveness check answered",
    )
    facts.confirmed_at, facts.unconfirmed_why = 200.0, None
    assert trust(facts, 200.0)[0] is IndexTrust.SYNCED


def test_a_disagreeing_hit_counter_makes_it_stale_until_a_window_agrees() -> None:
    facts = connected(disagreement="the engine reported 0 cached prompt tokens")
    assert trust(facts) == (IndexTrust.STALE, "the engine reported 0 cached prompt tokens")
    facts.disagreement = None
    assert trust(facts)[0] is IndexTrust.SYNCED


def test_an_open_gap_is_rebuilding_until_replayed() -> None:
    facts = connected(gap=(41, 57))
    assert trust(facts) == (IndexTrust.REBUILDING, "replaying missed batches 41..56")
    facts.gap = None
    assert trust(facts)[0] is IndexTrust.SYNCED


@pytest.mark.parametrize("field", ["rebuilding_since", "unknown_parent_at"])
def test_an_incomplete_index_rebuilds_for_a_window_then_is_synced(field: str) -> None:
    facts = connected(**{field: 100.0}, rebuilding_why="a gap the replay could not fill")
    for now, state in (
        (100.0 + WINDOW - 1, IndexTrust.REBUILDING),
        (100.0 + WINDOW, IndexTrust.SYNCED),
    ):
        facts.confirmed_at = now
        assert trust(facts, now)[0] is state


def test_the_strongest_doubt_wins() -> None:
    everything = TrustFacts(
        "tcp://e:5557",
        ever_connected=True,
        gap=(1, 2),
        rebuilding_since=99.0,
        disagreement="no",
    )
    assert trust(everything)[0] is IndexTrust.OFF
    everything.connected = True
    assert trust(everything)[0] is IndexTrust.OFF  # not yet confirmed
    everything.confirmed_at = 100.0 - IDLE
    assert trust(everything) == (
        IndexTrust.STALE,
        "not confirmed for 10s: no batch and no liveness check answered",
    )
    everything.confirmed_at = 100.0
    assert trust(everything) == (IndexTrust.STALE, "no")
    everything.disagreement = None
    assert trust(everything)[0] is IndexTrust.REBUILDING


def test_only_synced_and_rebuilding_indexes_are_usable() -> None:
    assert {state for state in IndexTrust if state.usable} == {
        IndexTrust.SYNCED,
        IndexTrust.REBUILDING,
    }
