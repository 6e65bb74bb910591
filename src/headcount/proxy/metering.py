"""A metered request's answer: the usage tap between the engine's body and the client.

A request flow control granted holds a `Ticket`; its answer is read by a
`UsageTap` (`usage.py`) for the tokens it used. Rather than ask at every body
piece whether a tap is there, the exchange puts a `TappedResponder` in front
of its client's responder once the engine's head is accepted: every piece
after goes through the tap, and an exchange without a ticket pays nothing per
piece.
"""

from __future__ import annotations

from headcount._http.handler import ExchangeListener, Responder
from headcount.proxy.usage import UsageTap

__all__ = ["TappedResponder"]


class TappedResponder:
    """`responder`, with each body piece fed through `tap` (which may hold back or drop)."""

    __slots__ = ("_responder", "dropped", "tap")

    def __init__(self, responder: Responder, tap: UsageTap) -> None:
        self._responder = responder
        self.tap = tap
        self.dropped = 0
        """Engine bytes the client was not sent (the usage event it did not ask for)."""

    def _through(self, body: bytes, complete: bool) -> bytes:
        tap = self.tap
        forwarded = tap.feed(body)
        if complete:
            rest = tap.end()
            if rest:  # compiled, `+` copies both sides even when one is empty
                forwarded += rest
        self.dropped += len(body) - len(forwarded)
        return forwarded

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
        forwarded = self._through(body, complete)
        self._responder.start(status, reason, header_block, content_length, forwarded, complete)

    def write(self, body: bytes, complete: bool) -> None:
        self._responder.write(self._through(body, complete), complete)

    def abort(self) -> None:
        self._responder.abort()

    def attach(self, listener: ExchangeListener) -> None:
        self._responder.attach(listener)
