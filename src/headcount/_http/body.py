"""A request body that came in several reads: few objects whatever the chunking, joined off-loop.

A body sent as tiny chunks must not become one object per chunk (an object's
overhead dwarfs a 2-byte chunk): pieces smaller than `_PIECE` are copied
together, so a body is held in one object per MiB at most. Objects of a MiB are
mapped on their own (`resources.release_large_allocations`), so a large body's
memory goes back to the system when it is freed; small pieces fragment the
heap and keep it resident. Joining the pieces into the one `bytes` a handler
gets copies the whole body, which for a large body takes milliseconds;
`bytes.join` releases the GIL while it copies, so from `JOIN_OFF_LOOP` up the
server joins in a thread. (Measured figures: bench/RESULTS.md, "Figures behind
the design".)
"""

from __future__ import annotations

__all__ = ["JOIN_OFF_LOOP", "BodyPieces"]

_PIECE = 1024 * 1024
JOIN_OFF_LOOP = 1024 * 1024
"""Bodies at least this large are joined in a worker thread, not on the event loop."""


class BodyPieces:
    """The pieces of one body so far; `take` hands them over and starts afresh."""

    __slots__ = ("_parts", "_small", "count")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._small = bytearray()
        self.count = 0
        """Pieces added since the last `take` or `clear`."""

    def add(self, piece: bytes) -> None:
        self.count += 1
        small = self._small
        if len(piece) >= _PIECE:
            if small:
                self._parts.append(bytes(small))
                small.clear()
            self._parts.append(piece)
            return
        small += piece
        if len(small) >= _PIECE:
            self._parts.append(bytes(small))
            small.clear()

    def take(self) -> list[bytes]:
        """Every piece, in order (the caller joins them); nothing is held any more."""
        parts = self._parts
        if self._small:
            parts.append(bytes(self._small))
            self._small.clear()
        self._parts = []
        self.count = 0
        return parts

    def clear(self) -> None:
        self._parts = []
        self._small = bytearray()
        self.count = 0
