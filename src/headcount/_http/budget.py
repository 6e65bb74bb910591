"""One bound on the request-body bytes held across all client connections.

Each request body is bounded by `max_body_size`, but a thousand clients each
uploading one would still hold a thousand of them. Every connection takes
from one shared `BodyBudget` as body bytes arrive (what arrived, never what a
Content-Length declares; a chunked body 64 KiB at a time) and gives them back
when the request's exchange ends or the connection does; a request that does
not fit is answered 503 (`overloaded`) instead of growing the router, in the
spirit of Envoy's overload manager. Only a request whose head passed the
server's screen (`handler.HeadScreen`: the key, the route) has its body read,
so a client without a key takes none of it.
"""

from __future__ import annotations

__all__ = ["BodyBudget"]


class BodyBudget:
    """Bytes of request bodies held now, and the most that may be."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        """Hold `size` more bytes if they fit; False (and nothing held) if not."""
        held = self.held + size
        if held > self.limit:
            return False
        self.held = held
        return True

    def give(self, size: int) -> None:
        """Release bytes taken earlier."""
        self.held -= size
