"""The fleet: every reconcile is a full replace; per-engine state dies with the engine."""

from __future__ import annotations

from functools import partial

from headcount.config import ProbeSettings
from headcount.fleet import EngineState, Fleet, FleetChange, ProbeResult
from headcount.fleet.vllm_load import VllmLoad
from tests.support import builders

PROBE = ProbeSettings()
CARDS = ({"id": "m", "object": "model"}, {"id": "m-lora", "object": "model", "parent": "m"})


spec = partial(builders.spec, id="uid-{name}", source="pods")
"""The engines here are pods, known by their uids."""
ready_fleet = partial(builders.ready_fleet, cards=CARDS)


def test_new_engine_is_pending_until_its_first_successful_probe() -> None:
    fleet = Fleet(unhealthy_after=PROBE.unhealthy_after)
    fleet.reconcile("pods", [spec("a")])
    assert fleet.snapshot.by_id["uid-a"].state is EngineState.PENDING
    assert fleet.snapshot.candidates("m") == ()
    fleet.apply_probe("uid-a", ProbeResult(ok=True, cards=CARDS))
    assert [e.id for e in fleet.snapshot.candidates("m")] == ["uid-a"]
    assert [e.id for e in fleet.snapshot.candidates("m-lora")] == ["uid-a"]


def test_reconcile_removes_engines_absent_from_the_list_and_keeps_other_sources() -> None:
    fleet = ready_fleet(spec("a"), spec("b"))
    fleet.reconcile("static", [spec("s", source="static")])
    change = fleet.reconcile("pods", [spec("a")])
    assert change.removed == ("uid-b",)
    assert set(fleet.snapshot.by_id) == {"uid-a", "uid-s"}


def test_unchanged_relist_asks_for_no_probe_but_a_changed_one_does() -> None:
    fleet = ready_fleet(spec("a"), spec("b"))
    change = fleet.reconcile("pods", [spec("a", resource_version="9"), spec("b")])
    assert change.to_probe == () and change.unchanged == 2
    assert fleet.snapshot.by_id["uid-a"].spec.resource_version == "9"
    change = fleet.reconcile("pods", [spec("a", lora_revision="2"), spec("b")])
    assert change.changed == ("uid-a",)
    assert fleet.snapshot.by_id["uid-a"].routable, "a changed engine keeps serving until re-probed"


def test_moved_engine_is_not_routed_until_probed_at_its_new_address() -> None:
    fleet = ready_fleet(spec("a"))
    fleet.upsert(spec("a", url="http://10.9.9.9:8000"))
    assert fleet.snapshot.by_id["uid-a"].state is EngineState.PENDING


def test_sleeping_engine_is_known_but_never_a_candidate() -> None:
    fleet = ready_fleet(spec("a"))
    fleet.upsert(spec("a", sleeping=True))
    engine = fleet.snapshot.by_id["uid-a"]
    assert engine.state is EngineState.SLEEPING
    assert fleet.snapshot.candidates("m") == ()
    assert fleet.snapshot.is_known("m")


def test_engine_becomes_unhealthy_after_consecutive_failed_probes_and_recovers() -> None:
    fleet = ready_fleet(spec("a"))
    fleet.apply_probe("uid-a", ProbeResult(ok=False, error="refused"))
    assert fleet.snapshot.by_id["uid-a"].routable, "one failed probe is not enough"
    fleet.apply_probe("uid-a", ProbeResult(ok=False, error="refused"))
    engine = fleet.snapshot.by_id["uid-a"]
    assert engine.state is EngineState.UNHEALTHY and engine.last_error == "refused"
    fleet.apply_probe("uid-a", ProbeResult(ok=True, cards=CARDS))
    assert fleet.snapshot.by_id["uid-a"].routable


def test_ejected_engine_leaves_rotation_until_a_probe_succeeds() -> None:
    fleet = ready_fleet(spec("a"), spec("b"))
    fleet.eject("uid-a", "connect refused")
    assert [e.id for e in fleet.snapshot.candidates("m")] == ["uid-b"]
    fleet.apply_probe("uid-a", ProbeResult(ok=True, cards=CARDS))
    assert len(fleet.snapshot.candidates("m")) == 2


def test_snapshot_is_immutable_across_writes() -> None:
    fleet = ready_fleet(spec("a"), spec("b"))
    before = fleet.snapshot
    fleet.remove("uid-a")
    assert set(before.by_id) == {"uid-a", "uid-b"}
    assert set(fleet.snapshot.by_id) == {"uid-b"}
    assert fleet.snapshot.version > before.version


def test_removed_engine_takes_its_load_counters_with_it() -> None:
    fleet = ready_fleet(spec("a"))
    fleet.snapshot.by_id["uid-a"].load.in_flight = 3
    fleet.remove("uid-a")
    fleet.reconcile("pods", [spec("a")])
    assert fleet.snapshot.by_id["uid-a"].load.in_flight == 0


def test_load_counters_survive_probes_and_spec_updates() -> None:
    fleet = ready_fleet(spec("a"))
    load = fleet.snapshot.by_id["uid-a"].load
    fleet.apply_probe("uid-a", ProbeResult(ok=True, cards=CARDS, load=VllmLoad(running=2)))
    fleet.upsert(spec("a", resource_version="7"))
    assert fleet.snapshot.by_id["uid-a"].load is load


def test_probe_of_a_removed_engine_is_ignored() -> None:
    fleet = ready_fleet(spec("a"))
    fleet.remove("uid-a")
    fleet.apply_probe("uid-a", ProbeResult(ok=True, cards=CARDS))
    assert fleet.snapshot.engines == ()


def test_listeners_hear_additions_changes_and_removals() -> None:
    heard: list[FleetChange] = []
    fleet = Fleet(unhealthy_after=PROBE.unhealthy_after)
    fleet.subscribe(heard.append)
    fleet.reconcile("pods", [spec("a"), spec("b")])
    fleet.upsert(spec("a", model_label="x"))
    fleet.remove("uid-b")
    assert heard[0].added == ("uid-a", "uid-b")
    assert heard[1].changed == ("uid-a",)
    assert heard[2].removed == ("uid-b",)


def test_model_cards_union_over_routable_engines_only() -> None:
    fleet = ready_fleet(spec("a"))
    fleet.reconcile("static", [spec("s", source="static", id="s")])
    fleet.apply_probe("s", ProbeResult(ok=True, cards=({"id": "other"},)))
    fleet.eject("s", "gone")
    assert [c["id"] for c in fleet.snapshot.model_cards()] == ["m", "m-lora"]


def test_not_ready_engine_from_its_source_is_not_routed() -> None:
    fleet = ready_fleet(spec("a"))
    fleet.upsert(spec("a", ready=False))
    assert fleet.snapshot.by_id["uid-a"].state is EngineState.NOT_READY
    fleet.apply_probe("uid-a", ProbeResult(ok=True, cards=CARDS))
    assert not fleet.snapshot.by_id["uid-a"].routable


def test_a_probe_that_only_changes_load_updates_it_in_place_without_a_rebuild() -> None:
    fleet = ready_fleet(spec("a"))
    before = fleet.snapshot
    fleet.apply_probe(
        "uid-a",
        ProbeResult(ok=True, cards=CARDS, load=VllmLoad(running=3, waiting=4, kv_usage=0.5)),
    )
    after = fleet.snapshot
    assert after is before, "scraped load must not cost a snapshot rebuild"
    load = after.by_id["uid-a"].load
    assert (load.running, load.waiting, load.kv_usage) == (3, 4, 0.5)


def test_a_probe_carries_the_prefix_cache_figures_and_a_later_silence_clears_them() -> None:
    fleet = ready_fleet(spec("a"))
    scraped = VllmLoad(
        prefix_cache_queries=900.0,
        prefix_cache_hits=300.0,
        kv_capacity_blocks=1000,
        kv_block_size=16,
    )
    figures = ProbeResult(ok=True, cards=CARDS, load=scraped)
    fleet.apply_probe("uid-a", figures)
    load = fleet.snapshot.by_id["uid-a"].load
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (900.0, 300.0)
    assert (load.kv_capacity_blocks, load.kv_block_size) == (1000, 16)
    fleet.apply_probe("uid-a", ProbeResult(ok=True, cards=CARDS))
    assert (load.prefix_cache_queries, load.kv_capacity_blocks, load.kv_block_size) == (
        None,
        None,
        None,
    )


def test_a_probe_that_changes_what_an_engine_serves_rebuilds_the_snapshot() -> None:
    fleet = ready_fleet(spec("a"))
    before = fleet.snapshot
    fleet.apply_probe("uid-a", ProbeResult(ok=True, cards=(*CARDS, {"id": "new", "parent": "m"})))
    assert fleet.snapshot is not before
    assert [e.id for e in fleet.snapshot.candidates("new")] == ["uid-a"]


def test_an_inconclusive_probe_records_its_error_and_changes_no_state() -> None:
    fleet = ready_fleet(spec("a"))
    for _ in range(PROBE.unhealthy_after + 1):
        fleet.apply_probe(
            "uid-a", ProbeResult(ok=False, error="dns: a: timeout", inconclusive=True)
        )
    engine = fleet.snapshot.by_id["uid-a"]
    assert (engine.state, engine.probe_failures, engine.last_error) == (
        EngineState.READY,
        0,
        "dns: a: timeout",
    )


def test_listeners_hear_an_engine_leave_rotation_once_per_write() -> None:
    heard: list[FleetChange] = []
    fleet = ready_fleet(spec("a"), spec("b"), spec("c"))
    fleet.subscribe(heard.append)
    fleet.eject("uid-a", "connect refused")
    for _ in range(PROBE.unhealthy_after + 1):  # the last one finds it out already
        fleet.apply_probe("uid-b", ProbeResult(ok=False, error="x"))
    fleet.upsert(spec("c", ready=False))
    assert [change.left for change in heard] == [("uid-a",), ("uid-b",), ("uid-c",)]
    assert [change.to_probe for change in heard] == [(), (), ("uid-c",)]
