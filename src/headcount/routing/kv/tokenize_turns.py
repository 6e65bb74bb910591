"""Which candidate's `POST /tokenize` is asked: each in turn, skipping those failing or stalled.

An engine is any pod anyone can label, and what it reports of its own load is
its word: choosing the tokenizing engine by the least reported load let one
that reports none and never answers make every request wait out the tokenize
timeout. So candidates take turns, and one whose `/tokenize` failed (timed
out or nearly, broke the connection, answered something that is no prompt's
ids) is left alone for a back-off: `BACKOFF_FIRST`, doubling with each failure in a
row up to `BACKOFF_MAX`. When it is over, one request asks it again (a
half-open circuit breaker): while that call is out, the others skip it; an
answer forgives it, another failure doubles its back-off. An engine that
fails at once costs nothing but its answer, so only what is the engine's
doing counts: a refusal (4xx, 5xx) may be the request's fault, and is not a
failure.

A failure is known only when the call ends, a timeout later: meanwhile the
requests whose turn it was would wait on the same hung engine. So an engine
with calls out that has answered none of them for `STALLED_AFTER` is skipped
until it answers one (or they all end). What is measured is the gap between
answers, not one call's wait: a busy engine answering many calls keeps moving,
however long its queue makes each call.

A hung engine costs the whole wait to the requests that asked it in its
first `STALLED_AFTER`, then `STALLED_AFTER` to one request per back-off
period (one minute at most; the request trying it again, `trying`, is routed
by load after that long: `prompts.EngineTokenize`) per router, wherever its
reported load stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from headcount.fleet import Engine

__all__ = ["BACKOFF_FIRST", "BACKOFF_MAX", "STALLED_AFTER", "TokenizeTurns"]

BACKOFF_FIRST = 5.0
"""Seconds an engine is left alone after its first failure: more than a blip, and less than
what a restarted engine takes to come back."""
BACKOFF_MAX = 60.0
"""The longest back-off; past it, an engine that is still failing costs one request a minute."""
STALLED_AFTER = 0.05
"""Seconds an engine may have calls out and answer none before it is skipped. A healthy
`/tokenize` answers in about a millisecond plus its server's queue; skipping one that is
merely paused costs nothing but asking another candidate, and each request that asks a hung
engine in this time waits the whole tokenize timeout."""
_CALLS_KEPT = 64
"""Engines whose calls out are counted before those with none out are dropped."""


@dataclass(slots=True)
class _Failing:
    failures: int
    until: float
    trying: bool = False
    """One request is asking it again now; the others skip it."""


@dataclass(slots=True)
class _Calls:
    out: int = 0
    since: float = 0.0
    """When it last answered, or began to have calls out."""


class TokenizeTurns:
    """The engines' turns at tokenizing, and what each one's last call came to."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._turn = 0
        self._failing: dict[str, _Failing] = {}
        self._calls: dict[str, _Calls] = {}
        """Each engine's calls out, kept when none are (an engine is asked again and again);
        those of engines with none are dropped when the map has doubled since the last time."""
        self._calls_prune_at = _CALLS_KEPT

    def choose(self, candidates: Sequence[Engine]) -> Engine | None:
        """The engine whose turn it is among `candidates` neither backing off nor stalled; None
        if all are. Its call must end in `answered`, `failed` or `abandoned`."""
        self._turn += 1
        if not candidates:
            return None
        engine = candidates[self._turn % len(candidates)]
        key = engine.spec.id  # not the `id` property: this is every request's path
        calls = self._calls.get(key)
        if self._failing or (
            calls is not None and calls.out and self._clock() - calls.since > STALLED_AFTER
        ):
            chosen = self._askable(candidates)
            if chosen is None:
                return None
            key = chosen.id
            calls = self._calls.get(key)
            engine = chosen
        if calls is None:
            calls = self._track(key)
        if not calls.out:
            calls.since = self._clock()
        calls.out += 1
        return engine

    def _track(self, key: str) -> _Calls:
        every = self._calls
        if len(every) >= self._calls_prune_at:
            for gone in [old for old, calls in every.items() if not calls.out]:
                del every[gone]
            self._calls_prune_at = max(_CALLS_KEPT, 2 * len(every))
        calls = every[key] = _Calls()
        return calls

    def _askable(self, candidates: Sequence[Engine]) -> Engine | None:
        """`choose`'s turn among the candidates neither backing off nor stalled."""
        now = self._clock()
        failing = self._failing
        every = self._calls
        askable = [
            engine
            for engine in candidates
            if (
                (state := failing.get(engine.id)) is None
                or (not state.trying and now >= state.until)
            )
            and (
                (calls := every.get(engine.id)) is None
                or not calls.out
                or now - calls.since <= STALLED_AFTER
            )
        ]
        if not askable:
            return None
        engine = askable[self._turn % len(askable)]
        state = failing.get(engine.id)
        if state is not None:
            state.trying = True
        return engine

    def trying(self, engine: Engine) -> bool:
        """Whether `engine`, just chosen, is asked again after its back-off."""
        if not self._failing:
            return False
        state = self._failing.get(engine.id)
        return state is not None and state.trying

    def answered(self, engine: Engine) -> None:
        """Its `/tokenize` answered (or refused): it is asked in turn again."""
        key = engine.spec.id
        if self._failing:
            self._failing.pop(key, None)
        self._ended(key, answered=True)

    def abandoned(self, engine: Engine) -> None:
        """The call ended for the router's reasons (the client left): nothing is learnt."""
        state = self._failing.get(engine.id)
        if state is not None:
            state.trying = False
        self._ended(engine.id)

    def failed(self, engine: Engine) -> None:
        """Its `/tokenize` failed: leave it alone for its back-off."""
        self._ended(engine.id)
        now = self._clock()
        failing = self._failing
        state = failing.get(engine.id)
        failures = 1 if state is None else state.failures + 1
        backoff = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** min(failures - 1, 16))
        failing[engine.id] = _Failing(failures, now + backoff)
        # Engines that left the fleet are forgotten once long past their back-off.
        for engine_id in [key for key, old in failing.items() if old.until + BACKOFF_MAX < now]:
            del failing[engine_id]

    def _ended(self, key: str, *, answered: bool = False) -> None:
        calls = self._calls.get(key)
        if calls is not None and calls.out:
            calls.out -= 1
            if answered and calls.out:
                calls.since = self._clock()
