"""A client connection driven by hand: limits, an app that echoes, a transport that records.

`EchoApp` answers with what it received, or as its path says (`/slow`, `/stream`,
`/nodelay`, `/hang`, `/big`, `/flood`); `refusing` is a head screen that answers
`/refused` from the head; `RecordingTransport` lets a test feed a connection reads
it chose and see what it wrote, with no socket.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from headcount._http.handler import Request, RequestHandler, Responder
from headcount._http.server import ServerLimits

__all__ = ["LIMITS", "EchoApp", "Flood", "Lost", "RecordingTransport", "refusing"]

LIMITS = ServerLimits(
    max_header_size=4096, max_body_size=1000, keepalive_timeout=5.0, max_pipeline=16
)


class Lost:
    """An ExchangeListener that remembers whether its client went away or paused."""

    def __init__(self) -> None:
        self.lost = False
        self.paused = False

    def client_lost(self) -> None:
        self.lost = True

    def client_paused(self) -> None:
        self.paused = True

    def client_resumed(self) -> None:
        pass


class Flood(Lost):
    """Streams 64 KiB chunks whenever the client takes them, as an engine's answer would."""

    def __init__(self, responder: Responder) -> None:
        super().__init__()
        self.responder = responder
        self.budget = 1000  # chunks: 64 MiB at most

    def client_resumed(self) -> None:
        self.paused = False
        while not self.paused and not self.lost and self.budget > 0:
            self.budget -= 1
            self.responder.write(b"x" * 65536, False)


class EchoApp:
    """Answers with what it received; `/slow` answers after a delay, `/stream` in parts."""

    def __init__(self) -> None:
        self.listeners: list[Lost] = []
        self.dispatched = 0

    def __call__(self, request: Request, responder: Responder) -> None:
        self.dispatched += 1
        if request.path == b"/slow":
            listener = Lost()
            self.listeners.append(listener)
            responder.attach(listener)
            asyncio.get_running_loop().call_later(0.2, self._echo, request, responder)
        elif request.path == b"/stream":
            responder.start(200, b"OK", b"content-type: text/plain\r\n", None, b"one,", False)
            loop = asyncio.get_running_loop()
            loop.call_later(0.02, responder.write, b"two,", False)
            loop.call_later(0.04, responder.write, b"three", True)
        elif request.path == b"/nodelay":
            sock = responder._transport.get_extra_info("socket")  # type: ignore[attr-defined]
            nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            responder.respond(200, b"", b"%d" % nodelay)
        elif request.path == b"/hang":
            listener = Lost()
            self.listeners.append(listener)
            responder.attach(listener)
        elif request.path == b"/big":
            responder.respond(200, b"", b"x" * int(request.query or b"65536"))
        elif request.path == b"/flood":
            listener = Flood(responder)
            self.listeners.append(listener)
            responder.attach(listener)
            responder.start(200, b"OK", b"", None, b"", False)
            listener.client_resumed()
        else:
            self._echo(request, responder)

    def _echo(self, request: Request, responder: Responder) -> None:
        document = {
            "method": request.method.decode(),
            "path": request.path.decode(),
            "query": request.query.decode(),
            "headers": {name.decode(): value.decode() for name, value in request.headers},
            "body": request.body.decode(),
            "client": request.client,
        }
        responder.respond(200, b"content-type: application/json\r\n", json.dumps(document).encode())


def _refuse(request: Request, responder: Responder) -> None:
    responder.respond(401, b"content-type: text/plain\r\n", b"refused from the head")


def refusing(request: Request) -> RequestHandler | None:
    """A `HeadScreen`: requests for `/refused` are answered 401 from their head alone."""
    return _refuse if request.path == b"/refused" else None


class RecordingTransport(asyncio.Transport):
    """The least a protocol needs from a transport: it records what is written."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default
