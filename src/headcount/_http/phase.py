"""Where a client connection is in reading its requests, and what may follow what.

h11's way: named phases, and every transition in one table of events. An event is a
dict from each phase it may happen in to the phase it leads to, so a transition is
one lookup (`phase = MESSAGE_BEGIN[phase]`), and an event in a phase it cannot
happen in has no entry: the lookup raises `KeyError` instead of moving the
connection anywhere. Plain dicts, as a transition is taken a few times per request.

Only reading is a phase. Answering runs beside it: with pipelining the next request
is read while this one is answered, so neither says anything of the other, and the
exchange in progress is the server's own (`HttpServerProtocol._request`).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

__all__ = [
    "BODY",
    "CLOSED",
    "CONNECTION_LOST",
    "HEAD",
    "HEADERS_COMPLETE",
    "IDLE",
    "MESSAGE_BEGIN",
    "MESSAGE_COMPLETE",
    "STOP",
    "STOPPED",
    "TRANSITIONS",
    "Phase",
]


class Phase(IntEnum):
    """A phase of reading; an `IntEnum` because its members hash in C (an `Enum`'s hash is
    a Python call, and the table is looked up a few times per request)."""

    IDLE = 0
    """Between requests: nothing of the next one has arrived."""
    HEAD = 1
    """A request's line and headers are arriving."""
    BODY = 2
    """Its head is whole; its body, if it has one, is arriving."""
    STOPPED = 3
    """Nothing more is parsed: what came before is answered, then the connection closes."""
    CLOSED = 4
    """The connection is gone."""


IDLE, HEAD, BODY, STOPPED, CLOSED = Phase
"""The members as module names: reading one through the class is an attribute lookup on
`EnumType`, several times the cost of a global."""


MESSAGE_BEGIN: Final[dict[Phase, Phase]] = {IDLE: HEAD}
"""A request begins."""
HEADERS_COMPLETE: Final[dict[Phase, Phase]] = {HEAD: BODY}
"""Its head is whole."""
MESSAGE_COMPLETE: Final[dict[Phase, Phase]] = {BODY: IDLE}
"""It is whole."""
STOP: Final[dict[Phase, Phase]] = {IDLE: STOPPED, HEAD: STOPPED, BODY: STOPPED, STOPPED: STOPPED}
"""Parsing stops; again from STOPPED, as a large body joined after that can still fail."""
CONNECTION_LOST: Final[dict[Phase, Phase]] = {
    IDLE: CLOSED,
    HEAD: CLOSED,
    BODY: CLOSED,
    STOPPED: CLOSED,
}
"""The connection is gone."""
TRANSITIONS: Final = {
    "message begin": MESSAGE_BEGIN,
    "headers complete": HEADERS_COMPLETE,
    "message complete": MESSAGE_COMPLETE,
    "stop": STOP,
    "connection lost": CONNECTION_LOST,
}
"""The whole table, by event. The parser orders the first three (a request begins, its
head ends, it ends); the others can come at any time before the connection is gone."""
