"""Bytes the data plane puts on the wire, built once at import: reasons, header names, errors.

Header names are compared lowercased (`bytes.lower()` once per header, as
httptools delivers them as sent). `error_body` renders the OpenAI error shape
that every error answer of headcount carries.
"""

from __future__ import annotations

import http
import json
from typing import Final

__all__ = [
    "CHUNKED_END",
    "CRLF",
    "HOP_BY_HOP",
    "INTERNAL_ERROR_BODY",
    "JSON_HEADER",
    "REASONS",
    "chunk",
    "connection_tokens",
    "error_body",
    "method_not_allowed_body",
    "not_found_body",
]

CRLF = b"\r\n"
CHUNKED_END = b"0\r\n\r\n"
JSON_HEADER = b"content-type: application/json\r\n"

_TABLED: Final = 4096
_SIZE_LINES: Final = tuple(b"%x\r\n" % size for size in range(_TABLED))
"""A chunk's size line for the sizes a stream's pieces have (an event is a few hundred bytes)."""


def chunk(body: bytes, last: bool) -> bytes:
    """`body` (not empty) framed as one chunk of a chunked body, and its end when `last`.

    Compiled, `%` with `%b` alone is one allocation and copy; `%x` is CPython's generic
    formatting, ten times the cost, so the size line comes from a table."""
    size = len(body)
    line = _SIZE_LINES[size] if size < _TABLED else b"%x\r\n" % size
    if last:
        return b"%b%b\r\n0\r\n\r\n" % (line, body)
    return b"%b%b\r\n" % (line, body)


REASONS: dict[int, bytes] = {status.value: status.phrase.encode() for status in http.HTTPStatus}

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""Headers that describe one connection, never forwarded (RFC 9110 §7.6.1); also any
`proxy-*` header and any header the `Connection` header names."""

_CONNECTION_OPTIONS = frozenset({b"close", b"keep-alive"})


def connection_tokens(value: bytes) -> frozenset[bytes]:
    """Header names listed in a `Connection` value, besides the `close`/`keep-alive` options."""
    tokens = {token.strip().lower() for token in value.split(b",")}
    return frozenset(tokens - _CONNECTION_OPTIONS - {b""})


def error_body(message: str, error_type: str, code: str) -> bytes:
    """The OpenAI error shape: `{"error": {"message", "type", "code"}}`."""
    return json.dumps({"error": {"message": message, "type": error_type, "code": code}}).encode()


INTERNAL_ERROR_BODY = error_body("internal error in the router", "internal_error", "internal_error")
"""For a bug in the router: the client learns nothing of it but that it happened."""


def not_found_body(path: str, hint: str = "") -> bytes:
    """The answer to a path nobody serves (here: `hint` says where it is served)."""
    message = f"no route for {path}; {hint}" if hint else f"no route for {path}"
    return error_body(message, "invalid_request_error", "not_found")


def method_not_allowed_body(method: str, path: str, allow: str) -> bytes:
    """The answer to a known path asked with the wrong method (sent with `allow: <allow>`)."""
    message = f"{method} not allowed on {path}; use {allow}"
    return error_body(message, "invalid_request_error", "method_not_allowed")
