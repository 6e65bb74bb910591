"""The contract between the HTTP server and whoever answers its requests.

The server hands each whole `Request` to a `RequestHandler` with a `Responder`
(the client connection's answering face). A handler that answers later
`attach`es an `ExchangeListener` to hear that its client paused, resumed or left.

A server may be given a `HeadScreen` too: it sees each request once its head is
whole, before any of its body is read or counted against the body budget, and
says which requests are answered from their head alone (no key, a path that
takes no body): their body is never read or held. And a `Rejected` hook hears of
each answer the server gives by itself (400, 408, 413, 431, 505...), and may
add to it (the proxy's `x-request-id`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = [
    "ConnectionNote",
    "ExchangeListener",
    "HeadScreen",
    "Rejected",
    "Request",
    "RequestHandler",
    "Responder",
]


class ConnectionNote:
    """What a head screen remembers of a connection between its requests: the credential it
    last accepted there (`key`), whose check that was (`owner`: a note taken by a checker
    since replaced is not used) and what it found (`value`). A keep-alive client sends the
    same key with every request, which need not be checked from scratch each time. The HTTP
    layer only carries it, one per connection."""

    __slots__ = ("key", "owner", "value")

    def __init__(self) -> None:
        self.key = b""
        self.owner: object = None
        self.value: object = None


class Request:
    """One request as the client sent it; header names lowercased, values as sent.

    Made when its head is whole; `body` is set once the body is (a request answered from
    its head alone keeps an empty one)."""

    __slots__ = (
        "body",
        "client",
        "headers",
        "http11",
        "identity",
        "is_head",
        "keep_alive",
        "method",
        "note",
        "path",
        "query",
        "subset",
        "target",
    )

    def __init__(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        http11: bool,
        keep_alive: bool,
        client: str = "",
    ) -> None:
        """`client`: the address the connection comes from (its host; "" if unknown)."""
        self.method = method
        self.target = target
        path, _, query = target.partition(b"?")
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.http11 = http11
        self.keep_alive = keep_alive
        self.client = client
        self.is_head = method == b"HEAD"
        self.identity: object = None
        """Who the head screen found the request comes from, for its handler (the data
        plane's business: its key's tenant); None when it noted nothing."""
        self.note: ConnectionNote | None = None
        """Its connection's note, for the head screen; None for a request no connection read
        (a gateway's)."""
        self.subset: frozenset[str] | None = None
        """The only engines (`host:port` each) the request may go to, as a gateway's subset
        hint names them; None: any."""


class ExchangeListener(Protocol):
    """What a handler answering later hears about its client connection."""

    def client_lost(self) -> None:
        """The client went away before the response was complete; called at most once."""

    def client_paused(self) -> None:
        """The client reads slower than we write: stop producing until `client_resumed`."""

    def client_resumed(self) -> None: ...


class Responder(Protocol):
    """How a handler answers the request it was given; each call is one socket write.

    `header_block` is rendered header lines (`name: value\\r\\n` each); framing
    (`content-length` or `transfer-encoding`) and `connection` are added here.
    """

    def respond(self, status: int, header_block: bytes, body: bytes) -> None:
        """A whole response at once."""

    def start(
        self,
        status: int,
        reason: bytes,
        header_block: bytes,
        content_length: int | None,
        body: bytes,
        complete: bool,
    ) -> None:
        """The head and the first part of the body; `content_length` None: chunked."""

    def write(self, body: bytes, complete: bool) -> None:
        """The next part of a started response."""

    def abort(self) -> None:
        """Close the connection with the response unfinished, so the client sees it broken."""

    def attach(self, listener: ExchangeListener) -> None:
        """Hear about the client until the response is complete."""


RequestHandler = Callable[[Request, Responder], None]
"""Called once per request; answers through the responder now or after `attach`."""

HeadScreen = Callable[[Request], RequestHandler | None]
"""Called once per request when its head is whole (its `body` still empty): None when the
body is wanted, so the connection's handler gets the request once it is whole; else the
handler that answers it from its head alone. The body of such a request is never read or
held: when it has one, the answer says `connection: close` and the connection closes
after it (what follows the head is never parsed as a request)."""

Rejected = Callable[[bytes, Request | None], bytes]
"""Called once per answer the server gives by itself (a whole response, `connection: close`),
with the request when its head was read (else None): returns the response to send, which
may carry more header lines (`answers.with_header`)."""
