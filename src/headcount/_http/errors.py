"""Why an upstream exchange failed, as a small tree the proxy acts on class by class.

OSError, TimeoutError and httptools' parser errors are translated here, at the
boundary, so the proxy never inspects a foreign exception::

    UpstreamError            the engine did not deliver a whole response
     ├── ConnectFailed       no connection: refused, unreachable, reset while connecting
     │    └── ConnectTimeout     ... not accepted within connect_timeout
     ├── NoResponse          closed or reset after the request was written, before any byte
     │    └── StaleConnection    ... on a reused keep-alive connection the engine had closed
     ├── UpstreamTimeout     no byte within read_timeout (ConnectTimeout is one too)
     └── StreamBroken        closed, reset or malformed after the first response byte
          └── ProtocolViolation  the engine broke HTTP/1.1 framing (see its docstring)

What the proxy does with each: `ConnectFailed` ejects the engine and fails over;
`NoResponse` fails over; `StaleConnection` retries once on a fresh connection
to the same engine; `UpstreamTimeout` answers 504; `StreamBroken` is never
retried: the engine may have done the work, and the client may have part of it.
A connection that saw a `ProtocolViolation` is closed, never reused.
"""

from __future__ import annotations

__all__ = [
    "ConnectFailed",
    "ConnectTimeout",
    "NoResponse",
    "ProtocolViolation",
    "StaleConnection",
    "StreamBroken",
    "UpstreamError",
    "UpstreamTimeout",
]


class UpstreamError(Exception):
    """The engine did not deliver a whole response; `reason` is a metric label."""

    reason = "upstream_error"


class ConnectFailed(UpstreamError):
    """No connection could be opened: safe to try another engine."""

    reason = "connect_failed"


class UpstreamTimeout(UpstreamError):
    """The engine stayed silent longer than allowed."""

    reason = "timeout"


class ConnectTimeout(ConnectFailed, UpstreamTimeout):
    """The engine did not accept the connection within `connect_timeout`."""

    reason = "connect_timeout"


class NoResponse(UpstreamError):
    """The connection ended after the request was written and before any response byte."""

    reason = "no_response"


class StaleConnection(NoResponse):
    """A reused keep-alive connection had been closed by the engine: retry on a fresh one."""

    reason = "stale_connection"


class StreamBroken(UpstreamError):
    """The response broke after its first byte: never retried."""

    reason = "stream_broken"


class ProtocolViolation(StreamBroken):
    """The engine broke HTTP/1.1 framing: a status outside 100-599, an unasked-for 101, bytes
    after a complete response, a body on an interim response, a head over the limit.

    Relaying any of it could put engine-crafted bytes where the client expects the answer to
    its next request; the exchange ends here and the connection is closed.
    """

    reason = "protocol_violation"
