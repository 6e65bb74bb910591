"""The client connection's reading phase: its transition table, and httptools keeping to it.

The table is checked as data (what may follow what); the parser's own callback order is
checked against it on arbitrary input, since the server takes those three transitions
on every request; and a connection is followed through its phases as a client drives it.
"""

from __future__ import annotations

import asyncio
import itertools

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headcount._http.connections import ConnectionRegistry
from headcount._http.phase import (
    BODY,
    CLOSED,
    CONNECTION_LOST,
    HEAD,
    HEADERS_COMPLETE,
    IDLE,
    MESSAGE_BEGIN,
    MESSAGE_COMPLETE,
    STOP,
    STOPPED,
    TRANSITIONS,
    Phase,
)
from headcount._http.server import HttpServerProtocol
from tests.support import wait_until
from tests.support.http_server import LIMITS, EchoApp, RecordingTransport


def test_a_request_is_read_idle_head_body_idle() -> None:
    assert HEADERS_COMPLETE[MESSAGE_BEGIN[IDLE]] is BODY
    assert MESSAGE_COMPLETE[BODY] is IDLE
    assert MESSAGE_BEGIN[IDLE] is HEAD


@pytest.mark.parametrize("phase", [IDLE, HEAD, BODY, STOPPED])
def test_parsing_can_stop_and_the_connection_can_go_in_any_phase_before_closed(
    phase: Phase,
) -> None:
    assert STOP[phase] is STOPPED
    assert CONNECTION_LOST[phase] is CLOSED


@pytest.mark.parametrize(
    ("event", "phase"),
    [
        (MESSAGE_BEGIN, HEAD),  # a request begins inside another
        (MESSAGE_BEGIN, BODY),
        (MESSAGE_BEGIN, STOPPED),  # parsing after it stopped
        (HEADERS_COMPLETE, IDLE),
        (HEADERS_COMPLETE, BODY),
        (MESSAGE_COMPLETE, HEAD),
        (MESSAGE_COMPLETE, IDLE),
        (MESSAGE_COMPLETE, STOPPED),
        (STOP, CLOSED),
        (CONNECTION_LOST, CLOSED),
    ],
)
def test_an_illegal_transition_raises(event: dict[Phase, Phase], phase: Phase) -> None:
    with pytest.raises(KeyError):
        event[phase]


def test_nothing_leaves_closed_and_a_stopped_connection_only_closes() -> None:
    assert [event for event in TRANSITIONS.values() if CLOSED in event] == []
    assert {event[STOPPED] for event in TRANSITIONS.values() if STOPPED in event} == {
        STOPPED,
        CLOSED,
    }


class _TableFollower:
    """httptools callbacks that move a phase through the table, as the server does."""

    def __init__(self) -> None:
        self.phase = IDLE

    def on_message_begin(self) -> None:
        self.phase = MESSAGE_BEGIN[self.phase]

    def on_headers_complete(self) -> None:
        self.phase = HEADERS_COMPLETE[self.phase]

    def on_message_complete(self) -> None:
        self.phase = MESSAGE_COMPLETE[self.phase]


_REQUESTS = st.sampled_from(
    [
        b"GET / HTTP/1.1\r\nHost: t\r\n\r\n",
        b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc",
        b"POST /b HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
        b"HEAD / HTTP/1.0\r\n\r\n",
    ]
)


@given(
    requests=st.lists(_REQUESTS, min_size=1, max_size=5),
    tail=st.binary(max_size=40),
    cuts=st.lists(st.integers(0, 400), max_size=6),
)
def test_httptools_calls_back_only_in_the_order_the_table_allows(
    requests: list[bytes], tail: bytes, cuts: list[int]
) -> None:
    # Pipelined requests, then anything at all, in any split: the parser's three
    # transitions are never illegal; it raises its own error on bad input instead.
    data = b"".join(requests) + tail
    follower = _TableFollower()
    parser = httptools.HttpRequestParser(follower)
    bounds = sorted({0, len(data), *(cut for cut in cuts if cut < len(data))})
    try:
        for start, end in itertools.pairwise(bounds):
            parser.feed_data(data[start:end])
    except httptools.HttpParserCallbackError:
        raise
    except httptools.HttpParserError:
        pass  # the tail was not HTTP


async def test_a_connection_goes_through_its_phases() -> None:
    app = EchoApp()
    transport = RecordingTransport()
    protocol = HttpServerProtocol(app, LIMITS, ConnectionRegistry(), asyncio.get_running_loop())
    protocol.connection_made(transport)
    assert protocol._phase is IDLE
    protocol.data_received(b"POST /echo HTTP/1.1\r\nHo")
    assert protocol._phase is HEAD
    protocol.data_received(b"st: t\r\nContent-Length: 4\r\n\r\nab")
    assert protocol._phase is BODY
    protocol.data_received(b"cd")
    await wait_until(lambda: app.dispatched == 1, timeout=5.0)
    assert protocol._phase is IDLE
    protocol.data_received(b"NOT HTTP\r\n\r\n")
    assert protocol._phase is STOPPED
    assert b" 400 " in transport.written
    protocol.connection_lost(None)
    assert protocol._phase is CLOSED
