"""The answers the client-facing server gives by itself, rendered once at import.

Each is a whole response in the OpenAI error shape with `connection: close`:
after any of them the server reads nothing more from that connection.
"""

from __future__ import annotations

from headcount._http.wire import JSON_HEADER, REASONS, error_body

__all__ = [
    "BAD_HOST",
    "BAD_REQUEST",
    "BAD_VERSION",
    "CONTINUE",
    "EXPECTATION_FAILED",
    "HEADERS_TOO_LARGE",
    "OVERLOADED",
    "REQUEST_TIMEOUT",
    "TOO_MANY_CONNECTIONS",
    "VERSION_NOT_SUPPORTED",
    "body_too_large",
    "status_of",
    "too_large_message",
    "with_header",
]


def _answer(status: int, message: str, code: str, extra: bytes = b"") -> bytes:
    error_type = "service_unavailable" if status == 503 else "invalid_request_error"
    body = error_body(message, error_type, code)
    return b"HTTP/1.1 %d %s\r\n%s%scontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
        status,
        REASONS[status],
        JSON_HEADER,
        extra,
        len(body),
        body,
    )


_RETRY_SOON = b"retry-after: 1\r\n"

BAD_REQUEST = _answer(400, "malformed HTTP request", "bad_request")
BAD_HOST = _answer(
    400, "an HTTP/1.1 request needs exactly one Host header (RFC 9112 3.2)", "bad_request"
)
BAD_VERSION = _answer(400, "request line without a valid HTTP version", "bad_request")
VERSION_NOT_SUPPORTED = _answer(
    505, "only HTTP/1.1 and HTTP/1.0 are spoken on this port", "http_version_not_supported"
)
HEADERS_TOO_LARGE = _answer(
    431, "request header fields too large", "request_header_fields_too_large"
)


def body_too_large(limit: int) -> bytes:
    """413, naming the limit and the flag that sets it (built when a body is refused)."""
    return _answer(413, too_large_message(limit), "request_too_large")


def too_large_message(limit: int) -> str:
    """What a 413 says: the limit and the flag that sets it."""
    return f"request body too large: over {limit} bytes, the router's --max-body-size"


def status_of(answer: bytes) -> int:
    """The status code of a whole response (`HTTP/1.1 413 ...`)."""
    return int(answer[9:12])


def with_header(answer: bytes, line: bytes) -> bytes:
    """`answer` with one more header line (`name: value\r\n`) after its status line."""
    end = answer.index(b"\r\n") + 2
    return answer[:end] + line + answer[end:]


CHUNKS_TOO_SMALL = _answer(
    400,
    "request body over 16 KiB sent in chunks too small (a mean under 64 bytes)",
    "chunks_too_small",
)
EXPECTATION_FAILED = _answer(417, "only `Expect: 100-continue` is supported", "expectation_failed")
REQUEST_TIMEOUT = _answer(408, "the request did not arrive in time", "request_timeout")
OVERLOADED = _answer(
    503,
    "the router holds as many request bodies as it may; retry shortly",
    "overloaded",
    _RETRY_SOON,
)
TOO_MANY_CONNECTIONS = _answer(
    503,
    "the router has as many client connections open as it may; retry shortly",
    "too_many_connections",
    _RETRY_SOON,
)
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
