"""Why an upstream exchange failed, as a small tree the proxy acts on class by class.

OSError, TimeoutError, DNS and httptools' parser errors are translated here, at
the boundary, so the proxy never inspects a foreign exception::

    UpstreamError            no whole response from the engine
     ├── ConnectFailed       no connection: refused, unreachable, reset while connecting
     │    └── ConnectTimeout     ... not accepted within connect_timeout
     ├── NoResponse          closed or reset after the request was written, before any byte
     │    └── StaleConnection    ... on a reused keep-alive connection the engine had closed
     ├── UpstreamTimeout     no byte within read_timeout (ConnectTimeout is one too)
     │    └── FirstByteTimeout   ... no first byte within first_byte_timeout: fail over
     ├── StreamBroken        closed, reset or malformed after the first response byte
     │    └── ProtocolViolation  the engine broke HTTP/1.1 framing (see its docstring)
     ├── Abandoned           the router stopped waiting: the engine left rotation or the fleet
     ├── LookupFailed        the engine's host name did not resolve: the DNS's trouble
     └── LocalResourceExhausted  the router itself is out of fds, memory or buffers

What the proxy does with each: `ConnectFailed` ejects the engine and fails over;
`NoResponse`, `FirstByteTimeout` and `Abandoned` fail over; `StaleConnection`
retries once on a fresh connection to the same engine; `UpstreamTimeout`
answers 504; `StreamBroken` is not failed over: the client may have part of
the answer (the proxy resumes a stream from it, or asks again for an answer it
held whole, `proxy/exchange.py`). A connection that saw a
`ProtocolViolation` is closed, never reused. The last three are not the
engine's failure: `Abandoned` and `LookupFailed` fail over without counting
against it, and `LocalResourceExhausted` is answered 503 at once (another engine
would need the same fd), never blamed on any engine.
"""

from __future__ import annotations

import errno
import socket

__all__ = [
    "Abandoned",
    "ConnectFailed",
    "ConnectTimeout",
    "FirstByteTimeout",
    "LocalResourceExhausted",
    "LookupFailed",
    "NoResponse",
    "ProtocolViolation",
    "StaleConnection",
    "StreamBroken",
    "UpstreamError",
    "UpstreamTimeout",
    "local_resource",
]


class UpstreamError(Exception):
    """No whole response from the engine; `reason` is a metric label."""

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
    """The response broke after its first byte: not failed over (the proxy may resume it)."""

    reason = "stream_broken"


class ProtocolViolation(StreamBroken):
    """The engine broke HTTP/1.1 framing: a status outside 100-599, an unasked-for 101, bytes
    after a complete response, a body on an interim response, a head over the limit.

    Relaying any of it could put engine-crafted bytes where the client expects the answer to
    its next request; the exchange ends here and the connection is closed.
    """

    reason = "protocol_violation"


class FirstByteTimeout(UpstreamTimeout):
    """No response byte within `first_byte_timeout` of the attempt: another engine may answer."""

    reason = "first_byte_timeout"


class Abandoned(UpstreamError):
    """The router stopped waiting for a first byte: the engine left rotation or the fleet.

    Not the engine's failure as far as this request can tell: it is not counted against it.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class LookupFailed(UpstreamError):
    """The engine's host name did not resolve (no such name, DNS error or timeout).

    The cluster DNS's trouble, not the engine's: fail over, never eject, never count it.
    """

    reason = "lookup_failed"


class LocalResourceExhausted(UpstreamError):
    """The router ran out of one of its own resources (`resource`: fds, memory, buffers).

    Never the engine's failure, and no other engine would fare better: answered 503 at once.
    """

    reason = "local_resource"

    def __init__(self, message: str, resource: str) -> None:
        super().__init__(message)
        self.resource = resource


_LOCAL_RESOURCES = {
    errno.EMFILE: "fds",
    errno.ENFILE: "fds",
    errno.ENOMEM: "memory",
    errno.ENOBUFS: "buffers",
}


def local_resource(error: OSError) -> str | None:
    """Which of the router's own resources `error` says is exhausted, if any.

    `fds` (EMFILE, ENFILE), `memory` (ENOMEM, or a lookup's EAI_MEMORY), `buffers` (ENOBUFS):
    the `resource` label of `headcount_local_resource_errors_total`.
    """
    if isinstance(error, socket.gaierror):
        return "memory" if error.errno == getattr(socket, "EAI_MEMORY", None) else None
    return _LOCAL_RESOURCES.get(error.errno) if error.errno is not None else None
