"""Which engine stores each Responses API response: learned from answers, asked by follow-ups.

vLLM keeps a response (`store`, true by default) in the memory of the engine
that made it, so a follow-up naming it (`previous_response_id`),
`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` succeed only
there; any other engine answers 404. `StoredResponses` maps each response id
to that engine, learned from the engine's own answer: the id is in the first
bytes of an unstreamed answer's JSON and in the stream's first event
(`response.created`), so only the answer's first `SCAN_MAX` bytes are looked
at (`find_response_id`), never the whole of a large one, and an exchange
that is no Responses create pays nothing.

The map is bounded (`max_entries`: the oldest is evicted first) and expiring
(`ttl` after it was learned); every lookup and change is counted by outcome
(`OUTCOMES`, `headcount_responses_affinity_total`) and the entries are a gauge
(`headcount_responses_affinity_entries`), both read at scrape time.

A follow-up is sent to its engine only (`follow`), never failed over to
another (which would answer 404); when that engine has left the fleet the
answer is 404 `response_engine_gone`, when it is in the fleet but out of
rotation (unhealthy, ejected, asleep, draining) 503 `response_engine_unavailable`:
the state may come back with it. An id the router never learned (another
router replica's, or from before a restart) is routed by `model` when the
request names one (the engine answers for itself), else answered 404 in
vLLM's words.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from headcount._http.handler import ExchangeListener, Responder
from headcount._http.wire import error_body
from headcount.fleet import Engine, Snapshot
from headcount.proxy.errors import ErrorAnswer

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_TTL",
    "ENGINE_GONE",
    "ENGINE_UNAVAILABLE",
    "FOLLOWED",
    "OUTCOMES",
    "SCAN_MAX",
    "IdTap",
    "Stored",
    "StoredResponses",
    "find_response_id",
    "follow",
    "not_found",
    "refusal",
    "response_id_of",
]

DEFAULT_MAX_ENTRIES = 100_000
"""Ids remembered at once (~30 MB at most): a day of a busy agent fleet's conversations."""
DEFAULT_TTL = 24 * 3600.0
"""An id is forgotten a day after it was learned: agent threads rarely span longer, and an
engine restarted meanwhile has lost it anyway."""
SCAN_MAX = 8192
"""Bytes of an answer searched for its id: it comes first in the body and in the first event."""

LEARNED = "learned"
FOLLOWED = "followed"
UNKNOWN = "unknown"
EXPIRED = "expired"
EVICTED = "evicted"
ENGINE_GONE = "engine_gone"
ENGINE_UNAVAILABLE = "engine_unavailable"
OUTCOMES = (LEARNED, FOLLOWED, UNKNOWN, EXPIRED, EVICTED, ENGINE_GONE, ENGINE_UNAVAILABLE)
"""The `outcome` label: an id learned; a follow-up sent to its engine; one whose id was never
learned (or had expired); an entry dropped for its age or for room; a follow-up refused
because its engine left the fleet or is out of rotation."""

_ID = re.compile(rb'"id"\s*:\s*"(resp_[^"\\]{1,200})"')
_RESPONSES = b"/v1/responses/"
_CANCEL = b"/cancel"


class Stored(NamedTuple):
    """Where one response is stored."""

    engine_id: str
    engine_name: str
    model: str
    expires: float


def find_response_id(body: bytes) -> str | None:
    """The response id in the start of an answer (a response object or its first event)."""
    found = _ID.search(body, 0, SCAN_MAX)
    return None if found is None else found.group(1).decode("latin-1")


def response_id_of(path: bytes, method: bytes) -> str | None:
    """The id in `GET /v1/responses/{id}` or `POST /v1/responses/{id}/cancel`, else None."""
    if not path.startswith(_RESPONSES):
        return None
    rest = path[len(_RESPONSES) :]
    if method == b"POST" and rest.endswith(_CANCEL):
        rest = rest[: -len(_CANCEL)]
    elif method != b"GET":
        return None
    if not rest or b"/" in rest:
        return None
    return rest.decode("latin-1")


class StoredResponses:
    """The bounded, expiring response id -> engine map, with its counts; see the module."""

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        ttl: float = DEFAULT_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self._max_entries = max_entries
        self._ttl = ttl
        self._clock = clock
        self.counts: dict[str, int] = dict.fromkeys(OUTCOMES, 0)

    def __len__(self) -> int:
        return len(self._entries)

    def learn(self, response_id: str, engine: Engine, model: str) -> None:
        """`engine` answered `response_id` (for `model`)."""
        now, entries, counts = self._clock(), self._entries, self.counts
        self._expire(now)
        entries.pop(response_id, None)
        while len(entries) >= self._max_entries:
            entries.popitem(last=False)
            counts[EVICTED] += 1
        entries[response_id] = Stored(engine.id, engine.spec.name, model, now + self._ttl)
        counts[LEARNED] += 1

    def find(self, response_id: str) -> Stored | None:
        """Where `response_id` is stored, if known and not expired (else counted `unknown`)."""
        stored = self._entries.get(response_id)
        if stored is not None and stored.expires <= self._clock():
            self._expire(self._clock())
            stored = None
        if stored is None:
            self.counts[UNKNOWN] += 1
        return stored

    def count(self, outcome: str) -> None:
        self.counts[outcome] += 1

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            oldest = next(iter(entries.values()))
            if oldest.expires > now:
                return
            entries.popitem(last=False)
            self.counts[EXPIRED] += 1

    def collector(self, _snapshot: Snapshot) -> _Collected:
        """Its metric families, copied now (`Metrics.scrape_also`)."""
        return _Collected(dict(self.counts), len(self._entries))


class _Collected:
    """The map's counts at one scrape."""

    def __init__(self, counts: dict[str, int], entries: int) -> None:
        self._counts = counts
        self._entries = entries

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "headcount_responses_affinity",
            "Responses API response ids learned from answers and follow-ups asking for them, "
            "by outcome.",
            labels=["outcome"],
        )
        for outcome, value in self._counts.items():
            total.add_metric([outcome], value)
        yield total
        yield GaugeMetricFamily(
            "headcount_responses_affinity_entries",
            "Response ids the router knows the storing engine of.",
            value=self._entries,
        )


def follow(snapshot: Snapshot, stored: Stored, model: str) -> Engine | str:
    """The engine storing a response if it can take a follow-up for `model`, else why not
    (`ENGINE_GONE`, `ENGINE_UNAVAILABLE`)."""
    engine = snapshot.by_id.get(stored.engine_id)
    if engine is None:
        return ENGINE_GONE
    for candidate in snapshot.candidates(model):
        if candidate.id == engine.id:
            return engine
    return ENGINE_UNAVAILABLE


def refusal(why: str, response_id: str, stored: Stored, snapshot: Snapshot) -> ErrorAnswer:
    """The answer to a follow-up of `response_id` its engine cannot take (`follow`'s `why`)."""
    name = stored.engine_name
    if why == ENGINE_GONE:
        message = (
            f"response {response_id} is stored on engine {name}, which has left the fleet: "
            "the response is gone with it; start again without previous_response_id"
        )
        return ErrorAnswer(
            404, error_body(message, "invalid_request_error", "response_engine_gone")
        )
    engine = snapshot.by_id.get(stored.engine_id)
    state = "out of rotation" if engine is None else f"out of rotation ({engine.state.value})"
    message = (
        f"response {response_id} is stored on engine {name}, which is {state}: "
        "only that engine can continue it; retry later"
    )
    return ErrorAnswer(
        503, error_body(message, "service_unavailable", "response_engine_unavailable")
    )


def not_found(response_id: str) -> ErrorAnswer:
    """vLLM's answer for an id it does not store, for one the router cannot place."""
    message = f"Response with id '{response_id}' not found."
    return ErrorAnswer(404, error_body(message, "invalid_request_error", "response_not_found"))


class IdTap:
    """`responder`, reading the answer's first `SCAN_MAX` bytes for its response id, which it
    tells `learn`; in front of a Responses create's client only until then."""

    __slots__ = ("_learn", "_responder", "_seen")

    def __init__(self, responder: Responder, learn: Callable[[str], None]) -> None:
        self._responder = responder
        self._learn: Callable[[str], None] | None = learn
        self._seen = b""

    def _scan(self, body: bytes) -> None:
        learn = self._learn
        if learn is None or not body:
            return
        seen = self._seen + body[:SCAN_MAX]
        found = find_response_id(seen)
        if found is not None or len(seen) >= SCAN_MAX:
            self._learn = None
            self._seen = b""
            if found is not None:
                learn(found)
        else:
            self._seen = seen

    def respond(self, status: int, header_block: bytes, body: bytes) -> None:
        self._responder.respond(status, header_block, body)

    def start(
        self,
        status: int,
        reason: bytes,
        header_block: bytes,
        content_length: int | None,
        body: bytes,
        complete: bool,
    ) -> None:
        if status == 200:
            self._scan(body)
        else:
            self._learn = None
        self._responder.start(status, reason, header_block, content_length, body, complete)

    def write(self, body: bytes, complete: bool) -> None:
        if self._learn is not None:
            self._scan(body)
        self._responder.write(body, complete)

    def abort(self) -> None:
        self._responder.abort()

    def attach(self, listener: ExchangeListener) -> None:
        self._responder.attach(listener)
