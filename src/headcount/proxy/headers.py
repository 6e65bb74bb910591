"""Header rewriting between client and engine: hop-by-hop dropped, framing redone, request id.

A proxy must not forward what describes one connection (RFC 9110 §7.6.1):
`hop-by-hop` headers, any `proxy-*` header and whatever the `Connection` header
names. Framing (`content-length`, `transfer-encoding`) is redone on each side.
The engine gets `host` for itself (added per pool) and an `x-request-id`; the
client gets the same id back. When the router has keys of its own, the
client's `Authorization` (the router's key) never reaches an engine: it is
dropped, and the engine key, if any, is sent in its place.
"""

from __future__ import annotations

from typing import Final

from headcount._http.wire import HOP_BY_HOP, connection_tokens

__all__ = ["find_header", "forward_headers", "is_event_stream", "response_headers"]

_REQUEST_DROP = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
_REQUEST_DROP_AUTHORIZATION = _REQUEST_DROP | {b"authorization"}
_RESPONSE_DROP = HOP_BY_HOP | {b"content-length", b"x-request-id"}
_EVENT_STREAM: Final = b"text/event-stream"


def forward_headers(
    headers: list[tuple[bytes, bytes]], length: int, authorization: bytes | None = None
) -> tuple[bytes, bytes | None]:
    """Rendered headers for the engine, framing and blank line included, and the request id.

    `authorization` None: the client's `Authorization` passes through; otherwise it is
    dropped and this rendered line (possibly empty) sent instead.
    """
    parts: list[bytes] = []
    drop = _REQUEST_DROP
    if authorization is not None:
        drop = _REQUEST_DROP_AUTHORIZATION
        parts.append(authorization)
    request_id: bytes | None = None
    for name, value in _end_to_end(headers, drop):
        if name == b"x-request-id":
            request_id = value
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"content-length: %d\r\n\r\n" % length)
    return b"".join(parts), request_id


def response_headers(headers: list[tuple[bytes, bytes]], request_id: bytes) -> bytes:
    """The engine's headers for the client, hop-by-hop and framing dropped, our request id added."""
    parts: list[bytes] = []
    for name, value in _end_to_end(headers, _RESPONSE_DROP):
        parts += (name, b": ", value, b"\r\n")
    parts += (b"x-request-id: ", request_id, b"\r\n")
    return b"".join(parts)


def find_header(headers: list[tuple[bytes, bytes]], wanted: bytes) -> bytes | None:
    """The first value of header `wanted` (lowercase), or None."""
    for name, value in headers:
        if name == wanted:
            return value
    return None


def is_event_stream(content_type: bytes | None) -> bool:
    """Whether a `Content-Type` value says server-sent events (a stream of chunks)."""
    if content_type is None:
        return False
    if content_type.startswith(_EVENT_STREAM):  # as engines write it: no copies made
        return True
    return content_type.lstrip().lower().startswith(_EVENT_STREAM)


def _end_to_end(
    headers: list[tuple[bytes, bytes]], drop: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """`headers` without `drop`, `proxy-*` and whatever any `connection` header line names."""
    kept: list[tuple[bytes, bytes]] = []
    listed: frozenset[bytes] = frozenset()
    for name, value in headers:
        if name in drop or name.startswith(b"proxy-"):
            if name == b"connection":
                listed |= connection_tokens(value)
            continue
        kept.append((name, value))
    if listed:
        return [(name, value) for name, value in kept if name not in listed]
    return kept
