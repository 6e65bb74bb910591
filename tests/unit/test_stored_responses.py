"""The response id -> engine map: learned from answers, bounded, expiring, counted; follow-ups
placed on the engine that stores their response or refused with the reason."""

from __future__ import annotations

import json

from headcount.fleet import EngineState, Snapshot
from headcount.proxy.stored_responses import (
    ENGINE_GONE,
    ENGINE_UNAVAILABLE,
    SCAN_MAX,
    IdTap,
    StoredResponses,
    find_response_id,
    follow,
    refusal,
    response_id_of,
)
from tests.support.builders import MODEL, engine
from tests.support.clock import FakeClock

__all__: list[str] = []

_OBJECT = json.dumps(
    {"id": "resp_abc", "object": "response", "previous_response_id": "resp_old", "output": []}
).encode()
_EVENT = (
    b"event: response.created\n"
    b'data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_s1"}}\n\n'
)


def test_the_id_is_read_from_an_answer_or_its_first_event_only() -> None:
    assert find_response_id(_OBJECT) == "resp_abc"
    assert find_response_id(_EVENT) == "resp_s1"
    continued = b'{"previous_response_id":"resp_old","output":[{"id":"msg_1"}]}'
    assert find_response_id(continued) is None, "only an `id` field names the response"
    assert find_response_id(b" " * SCAN_MAX + _OBJECT) is None, "the scan is bounded"


def test_only_get_and_cancel_of_one_id_are_by_id() -> None:
    assert response_id_of(b"/v1/responses/resp_1", b"GET") == "resp_1"
    assert response_id_of(b"/v1/responses/resp_1/cancel", b"POST") == "resp_1"
    assert response_id_of(b"/v1/responses/resp_1", b"POST") is None
    assert response_id_of(b"/v1/responses/resp_1", b"DELETE") is None
    assert response_id_of(b"/v1/responses/", b"GET") is None
    assert response_id_of(b"/v1/responses/a/b", b"GET") is None
    assert response_id_of(b"/v1/responses", b"POST") is None


def test_entries_expire_are_evicted_oldest_first_and_are_counted() -> None:
    clock = FakeClock()
    stored = StoredResponses(max_entries=2, ttl=10, clock=clock)
    a, b = engine("a"), engine("b")
    stored.learn("resp_1", a, MODEL)
    clock.advance(5)
    stored.learn("resp_2", b, MODEL)
    stored.learn("resp_3", a, MODEL)  # evicts resp_1
    assert stored.find("resp_1") is None
    found = stored.find("resp_2")
    assert found is not None and (found.engine_id, found.engine_name) == (b.id, "b")
    clock.advance(10)  # resp_2 and resp_3 are past their 10 s
    assert stored.find("resp_3") is None
    assert len(stored) == 0
    assert stored.counts == {
        "learned": 3,
        "followed": 0,
        "unknown": 2,
        "expired": 2,
        "evicted": 1,
        "engine_gone": 0,
        "engine_unavailable": 0,
    }


def test_a_follow_up_goes_to_its_engine_or_says_why_it_cannot() -> None:
    clock = FakeClock()
    stored = StoredResponses(clock=clock)
    a, b = engine("a"), engine("b")
    stored.learn("resp_1", a, MODEL)
    entry = stored.find("resp_1")
    assert entry is not None
    assert follow(Snapshot([a, b], 1), entry, MODEL) is a
    unhealthy = engine("a", state=EngineState.UNHEALTHY)
    assert follow(Snapshot([unhealthy, b], 2), entry, MODEL) == ENGINE_UNAVAILABLE
    assert follow(Snapshot([a, b], 3, ejected=frozenset({a.id})), entry, MODEL) == (
        ENGINE_UNAVAILABLE
    )
    assert follow(Snapshot([b], 4), entry, MODEL) == ENGINE_GONE

    gone = refusal(ENGINE_GONE, "resp_1", entry, Snapshot([b], 4))
    error = json.loads(gone.body)["error"]
    assert (gone.status, error["code"]) == (404, "response_engine_gone")
    assert "engine a" in error["message"] and "left the fleet" in error["message"]
    away = refusal(ENGINE_UNAVAILABLE, "resp_1", entry, Snapshot([unhealthy, b], 2))
    error = json.loads(away.body)["error"]
    assert (away.status, error["code"]) == (503, "response_engine_unavailable")
    assert "out of rotation (unhealthy)" in error["message"]


class _Client:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def respond(self, status: int, header_block: bytes, body: bytes) -> None:
        self.sent.append(body)

    def start(
        self,
        status: int,
        reason: bytes,
        header_block: bytes,
        content_length: int | None,
        body: bytes,
        complete: bool,
    ) -> None:
        self.sent.append(body)

    def write(self, body: bytes, complete: bool) -> None:
        self.sent.append(body)

    def abort(self) -> None: ...

    def attach(self, listener: object) -> None: ...


def test_the_tap_finds_an_id_split_across_reads_and_passes_every_byte() -> None:
    client, learned = _Client(), []
    tap = IdTap(client, learned.append)
    stream = _EVENT + b"event: response.completed\ndata: {}\n\n"
    tap.start(200, b"OK", b"", None, b"", False)
    for index in range(0, len(stream), 7):
        tap.write(stream[index : index + 7], False)
    assert learned == ["resp_s1"]
    assert b"".join(client.sent) == stream


def test_the_tap_learns_nothing_from_an_error() -> None:
    learned: list[str] = []
    tap = IdTap(_Client(), learned.append)
    tap.start(404, b"Not Found", b"", None, _OBJECT, True)
    assert learned == []
