"""An index's trust as a pure function of what its stream and the router recorded, and the time."""

from __future__ import annotations

import pytest

from headcount.kvindex.trust import IndexTrust, TrustFacts, evaluate

__all__: list[str] = []

IDLE, WINDOW = 10.0, 30.0


def trust(facts: TrustFacts, now: float = 100.0) -> tuple[IndexTrust, str]:
    return evaluate(facts, now, idle_timeout=IDLE, rebuild_window=WINDOW)


def connected(**facts: object) -> TrustFacts:
    return TrustFacts(endpoint="tcp://e:5557", connected=True, ever_connected=True, **facts)  # type: ignore[arg-type]


def test_no_session_with_the_publisher_is_off_and_says_whether_it_ever_had_one() -> None:
    assert trust(TrustFacts("tcp://e:5557")) == (
        IndexTrust.OFF,
        "no publisher reached at tcp://e:5557",
    )
    lost = TrustFacts("tcp://e:5557", ever_connected=True, awaiting_since=0.0)
    assert trust(lost) == (IndexTrust.OFF, "lost the publisher at tcp://e:5557")


def test_a_connected_stream_with_nothing_amiss_is_synced() -> None:
    assert trust(connected()) == (IndexTrust.SYNCED, "events flowing")


def test_events_overdue_after_the_engine_answered_make_it_stale_until_they_come() -> None:
    facts = connected(awaiting_since=100.0, awaiting_answers=3)
    assert trust(facts, 100.0 + IDLE - 0.1)[0] is IndexTrust.SYNCED
    state, reason = trust(facts, 100.0 + IDLE + 2)
    assert state is IndexTrust.STALE
    assert reason == "no event for 12s after 3 requests were answered"
    facts.awaiting_since = None
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
    assert trust(facts, 100.0 + WINDOW - 1)[0] is IndexTrust.REBUILDING
    assert trust(facts, 100.0 + WINDOW)[0] is IndexTrust.SYNCED


def test_the_strongest_doubt_wins() -> None:
    everything = TrustFacts(
        "tcp://e:5557",
        ever_connected=True,
        gap=(1, 2),
        rebuilding_since=99.0,
        awaiting_since=0.0,
        disagreement="no",
    )
    assert trust(everything)[0] is IndexTrust.OFF
    everything.connected = True
    assert trust(everything)[0] is IndexTrust.STALE
    everything.awaiting_since = everything.disagreement = None
    assert trust(everything)[0] is IndexTrust.REBUILDING


def test_only_synced_and_rebuilding_indexes_are_usable() -> None:
    assert {state for state in IndexTrust if state.usable} == {
        IndexTrust.SYNCED,
        IndexTrust.REBUILDING,
    }
