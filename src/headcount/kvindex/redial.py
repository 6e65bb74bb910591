"""When to dial an engine's publisher again after ZMQ dropped the session for good.

ZMQ redials a peer that went away, but never one that broke the protocol,
and a frame over the socket's maximum size is such a break: without a new
dial, one oversized frame would leave the engine's index off forever. The
subscriber dials again itself, after a wait that doubles while sessions end
soon after their handshake, so a publisher that keeps sending what ZMQ
refuses costs a handshake every few seconds, not a dial loop.
"""

from __future__ import annotations

from headcount.clock import Clock

__all__ = ["Redial"]

SHORT_SESSION = 10.0
"""A session lost sooner than this after its handshake doubles the next wait."""


class Redial:
    """The wait before the next dial: `least` after a session that lasted, doubling to `most`."""

    __slots__ = ("_clock", "_least", "_most", "_next", "_up_at")

    def __init__(self, least: float, most: float, clock: Clock) -> None:
        self._least, self._most = least, most
        self._clock = clock
        self._next = least
        self._up_at = clock() - SHORT_SESSION

    def up(self) -> None:
        """A session completed its handshake."""
        self._up_at = self._clock()

    def lost(self) -> float:
        """The session is gone: seconds to wait before dialling again."""
        short = self._clock() - self._up_at < SHORT_SESSION
        wait = self._next if short else self._least
        self._next = min(wait * 2, self._most)
        return wait
