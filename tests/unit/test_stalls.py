"""The stall watch's decisions, without I/O: when an engine counts as stalled, and what follows.

The watch's ticks are run by hand (a loop that only records `call_later`):
an engine is stalled once the same request has waited a whole timeout (two
ticks) and the engine sent no response head meanwhile, nor (when it exports
vLLM's token counters) processed a token by a scrape in that time; a head to
any request, a token, or the oldest request leaving keeps it in rotation; a
window no scrape reached proves nothing; the watch stops when nothing waits.
The proxy's side is tests/process/test_stalls.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headcount.config import OutlierSettings
from headcount.fleet import Fleet, ProbeResult
from headcount.fleet.vllm_load import VllmLoad
from headcount.proxy.stalls import Sample, StallWatch, stalled
from headcount.surfaces.metrics import Metrics
from tests.support import ready_fleet, spec

TIMEOUT = 30.0


class Ticks:
    """Stands in for the event loop: keeps what `call_later` was asked to run."""

    def __init__(self) -> None:
        self.due: list[tuple[float, Callable[..., None], tuple[Any, ...]]] = []

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self.due.append((delay, callback, args))

    def run(self) -> float:
        delay, callback, args = self.due.pop(0)
        callback(*args)
        return delay


class Request:
    """A waiting request: told when its engine stalls, it stops waiting (fails over)."""

    def __init__(self, waiting: dict[Any, None]) -> None:
        self.waiting = waiting
        self.told: list[str] = []
        waiting[self] = None

    def stalled(self, message: str) -> None:
        self.told.append(message)
        del self.waiting[self]


def watched() -> tuple[StallWatch, Fleet, dict[str, dict[Any, None]], Ticks]:
    fleet = ready_fleet(spec("a"), outliers=OutlierSettings())
    waiting: dict[str, dict[Any, None]] = {"a": {}}
    watch = StallWatch(TIMEOUT, waiting, fleet, Metrics(lambda: fleet.snapshot))
    return watch, fleet, waiting, Ticks()


def probed(fleet: Fleet, tokens: float | None) -> None:
    """A probe of engine "a" whose `/metrics` counted `tokens` processed (None: no counters)."""
    fleet.apply_probe("a", ProbeResult(ok=True, load=VllmLoad(progress=tokens)))


def test_stalled_needs_the_same_oldest_request_and_no_head_since() -> None:
    oldest, other = object(), object()
    assert stalled(Sample(oldest, 7, None, 0), Sample(oldest, 7, None, 0))
    assert not stalled(Sample(oldest, 7, None, 0), Sample(oldest, 8, None, 0)), "a head to anyone"
    assert not stalled(Sample(oldest, 7, None, 0), Sample(other, 7, None, 0)), "the oldest left"
    assert not stalled(Sample(None, 7, None, 0), Sample(None, 7, None, 0)), "nothing waits"


def test_with_token_counters_an_engine_is_stalled_only_if_they_stood_still_too() -> None:
    """Issue 17, finding 11 again: vLLM sends a non-streamed answer's head when it is done, so
    an engine generating long unstreamed answers sends no head for minutes and is healthy."""
    oldest = object()
    assert not stalled(Sample(oldest, 7, 100.0, 3), Sample(oldest, 7, 180.0, 5)), "generating"
    assert stalled(Sample(oldest, 7, 100.0, 3), Sample(oldest, 7, 100.0, 5)), "frozen"
    assert not stalled(Sample(oldest, 7, 100.0, 3), Sample(oldest, 7, 100.0, 3)), "no scrape since"
    assert not stalled(Sample(oldest, 7, 100.0, 3), Sample(oldest, 8, 100.0, 5)), "a head"
    assert stalled(Sample(oldest, 7, 100.0, 3), Sample(oldest, 7, None, 5)), "heads alone"
    assert stalled(Sample(oldest, 7, None, 3), Sample(oldest, 7, None, 3)), "no counters"


def test_requests_waiting_a_whole_timeout_on_a_silent_engine_move_and_it_is_ejected() -> None:
    watch, fleet, waiting, ticks = watched()
    engine = fleet.snapshot.by_id["a"]
    first, second = Request(waiting["a"]), Request(waiting["a"])
    watch.watch(engine, ticks)  # type: ignore[arg-type]
    assert ticks.run() == TIMEOUT / 2 and not first.told, "half a timeout proves nothing"
    ticks.run()
    assert first.told == second.told == ["engine a stalled: no response byte to any request in 30s"]
    assert "a" in fleet.snapshot.ejected and fleet.snapshot.by_id["a"].ejection.reason == "stalled"
    assert ticks.due == [], "nothing waits: the watch stops"


def test_a_silent_engine_still_processing_tokens_keeps_its_requests_until_they_stop() -> None:
    watch, fleet, waiting, ticks = watched()
    engine = fleet.snapshot.by_id["a"]
    batch = Request(waiting["a"])  # a long unstreamed answer: no head until it is done
    probed(fleet, 1000.0)
    watch.watch(engine, ticks)  # type: ignore[arg-type]
    for tokens in range(1100, 2000, 100):  # no head ever; a scrape a tick, tokens moving
        probed(fleet, float(tokens))
        ticks.run()
    assert batch.told == [] and fleet.snapshot.ejected == frozenset()
    ticks.run()
    ticks.run()  # a whole timeout with no scrape: no evidence, no verdict
    assert batch.told == []
    probed(fleet, 1900.0)  # the next scrape: no token since the one a timeout ago
    ticks.run()
    assert batch.told == [
        "engine a stalled: no response byte to any request and no token processed in 30s"
    ]
    assert fleet.snapshot.by_id["a"].ejection.reason == "stalled"


def test_an_engine_answering_anyone_is_not_stalled() -> None:
    watch, fleet, waiting, ticks = watched()
    engine = fleet.snapshot.by_id["a"]
    long = Request(waiting["a"])
    watch.watch(engine, ticks)  # type: ignore[arg-type]
    for _ in range(6):
        engine.load.answered += 1  # others' heads keep coming: a long prefill, not a stall
        ticks.run()
    assert long.told == [] and fleet.snapshot.ejected == frozenset()
    ticks.run()
    ticks.run()  # silent for a whole timeout now
    assert long.told != []


def test_watching_twice_is_one_watch_and_it_ends_with_the_wait() -> None:
    watch, fleet, waiting, ticks = watched()
    engine = fleet.snapshot.by_id["a"]
    request = Request(waiting["a"])
    watch.watch(engine, ticks)  # type: ignore[arg-type]
    watch.watch(engine, ticks)  # type: ignore[arg-type]
    assert len(ticks.due) == 1
    del waiting["a"][request]
    ticks.run()
    assert ticks.due == []
    watch.watch(engine, ticks)  # type: ignore[arg-type]
    assert len(ticks.due) == 1, "waiting again: watched again"


def test_an_engine_removed_and_added_again_is_watched_from_scratch() -> None:
    watch, fleet, waiting, ticks = watched()
    old = fleet.snapshot.by_id["a"]
    request = Request(waiting["a"])
    watch.watch(old, ticks)  # type: ignore[arg-type]
    ticks.run()
    fleet.remove("a")
    fleet.reconcile("static", [old.spec])  # a new engine under the same id, a new load
    assert fleet.snapshot.by_id["a"].load is not old.load
    ticks.run()
    ticks.run()
    assert request.told == [], "a whole timeout of the new engine has not passed"
    ticks.run()
    assert request.told != []
