"""Requests the router answers itself: plain, decoded types for the admin app.

The data plane hands every request it does not proxy (`/v1/models`, `/engines`,
health, metrics, unknown paths) to a `LocalHandler`, a coroutine from
`LocalRequest` to `LocalResponse` that knows nothing of the wire. `serve_local`
runs it as a task that a client leaving cancels, and sends the request's
`x-request-id` back on every answer; a handler that raises gets a generic 500
(logged once; no stack trace reaches the client). `not_found` and
`method_not_allowed` are the OpenAI-shaped errors for a path nobody serves and
a known path asked with the wrong method (405 with `Allow`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from headcount._http.handler import Request, Responder
from headcount._http.wire import (
    INTERNAL_ERROR_BODY,
    JSON_HEADER,
    method_not_allowed_body,
    not_found_body,
)

__all__ = [
    "LocalHandler",
    "LocalRequest",
    "LocalResponse",
    "TaskExchange",
    "method_not_allowed",
    "not_found",
    "serve_local",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocalRequest:
    """A request the router answers itself; header names lowercased."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class LocalResponse:
    """The answer to a `LocalRequest`; framing and `connection` headers are added for you."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, payload: object) -> LocalResponse:
        return cls(status, json.dumps(payload).encode())


def not_found(path: str, hint: str = "") -> LocalResponse:
    """404 for `path`; `hint` says where it is served, if elsewhere."""
    return LocalResponse(404, not_found_body(path, hint))


def method_not_allowed(method: str, path: str, allow: str) -> LocalResponse:
    """405 for `method` on `path`, which answers only the methods in `allow` ("GET, HEAD")."""
    return LocalResponse(
        405, method_not_allowed_body(method, path, allow), headers={"allow": allow}
    )


LocalHandler = Callable[[LocalRequest], Awaitable[LocalResponse]]
"""Answers every request that is not proxied (an unknown path included: 404 is its call)."""

Spawn = Callable[[Awaitable[None]], "asyncio.Task[None]"]


def serve_local(
    handler: LocalHandler, request: Request, responder: Responder, spawn: Spawn, request_id: bytes
) -> None:
    """Answer `request` with `handler` in a task from `spawn`, with `x-request-id: request_id`;
    the client leaving cancels it."""
    task = spawn(_answer(handler, request, responder, b"x-request-id: %s\r\n" % request_id))
    responder.attach(TaskExchange(task))


async def _answer(
    handler: LocalHandler, request: Request, responder: Responder, request_id: bytes
) -> None:
    try:
        response = await handler(_decoded(request))
        status, block, body = response.status, _header_block(response), response.body
    except Exception:
        _log.exception("local handler failed on %r", request.path)
        status, block, body = 500, JSON_HEADER, INTERNAL_ERROR_BODY
    responder.respond(status, block + request_id, body)


class TaskExchange:
    """A request answered by a task, linked to its client: a client that leaves cancels it."""

    __slots__ = ("_task",)

    def __init__(self, task: asyncio.Task[None]) -> None:
        self._task = task

    def client_lost(self) -> None:
        self._task.cancel()

    def client_paused(self) -> None:
        pass

    def client_resumed(self) -> None:
        pass


def _decoded(request: Request) -> LocalRequest:
    return LocalRequest(
        method=request.method.decode("latin-1"),
        path=request.path.decode("latin-1"),
        query=request.query.decode("latin-1"),
        headers={
            name.decode("latin-1"): value.decode("latin-1") for name, value in request.headers
        },
        body=request.body,
    )


def _header_block(response: LocalResponse) -> bytes:
    lines = [f"content-type: {response.content_type}\r\n"]
    lines += (f"{name}: {value}\r\n" for name, value in response.headers.items())
    return "".join(lines).encode("latin-1")
