"""A request body that came in several reads: few objects whatever the chunking, joined off-loop.

A body sent as 2-byte chunks must not become one object per chunk (31 MiB that
way was 925 MiB of `bytes`): pieces smaller than `_PIECE` are copied together,
so a body is held in one object per MiB at most. Objects of a MiB are mapped on
their own (`resources.release_large_allocations`), so a large body's memory goes
back to the system when it is freed; 16 KiB pieces fragmented the heap, and a
router that had read four 31 MiB bodies at a time stayed 110 MiB larger.
Joining the pieces into the one `bytes` a handler gets is a copy of the whole
body, 3-20 ms for 31 MiB (page faults of fresh memory included); `bytes.join`
releases the GIL while it copies, so from `JOIN_OFF_LOOP` up the server joins
in a thread.
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
