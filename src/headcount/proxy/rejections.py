"""The HTTP layer's own refusals (400, 408, 413, 431, 505, and 503 for a connection over
`--max-connections` or a body that could not be held) as the proxy answers for them.

The server answers these by itself, before any handler sees the request; this
is its `Rejected` hook on the data and admin ports: each refusal is counted (model
`unknown`), carries an `x-request-id` like every other answer (the client's,
when its head was read and had one, else a new one) and gets an access-log
line. None of it runs for a request the server reads whole.
"""

from __future__ import annotations

from collections.abc import Callable

from headcount._http.answers import status_of, with_header
from headcount._http.handler import Request
from headcount.auth.tenants import Tenant
from headcount.proxy.headers import find_header
from headcount.surfaces.access_log import AccessEntry, AccessLog
from headcount.surfaces.metrics import Metrics, whole

__all__ = ["LayerRejections", "refusal_entry", "tenant_name"]

_UNREAD = b"-"
"""Method and path of a request whose head was not read."""


def tenant_name(identity: object) -> str | None:
    """The tenant a client key named (`Request.identity`), for the access log."""
    return identity.name if isinstance(identity, Tenant) else None


def refusal_entry(
    request: Request | None,
    request_id: bytes,
    model: str,
    status: int,
    duration: float,
    bytes_out: int,
) -> AccessEntry:
    """The access-log line of a request no engine saw (`request` None: its head unread)."""
    return AccessEntry(
        request_id=request_id,
        method=_UNREAD if request is None else request.method,
        path=_UNREAD if request is None else request.path,
        model=model,
        status=status,
        outcome=whole(status),
        duration=duration,
        bytes_in=0 if request is None else len(request.body),
        bytes_out=bytes_out,
        tenant=None if request is None else tenant_name(request.identity),
    )


class LayerRejections:
    """The data port's `Rejected` hook; see the module docstring."""

    __slots__ = ("_access", "_metrics", "_new_id")

    def __init__(self, metrics: Metrics, access: AccessLog, new_id: Callable[[], bytes]) -> None:
        """`new_id()`: a new request id, for a request that brought none."""
        self._metrics = metrics
        self._access = access
        self._new_id = new_id

    def __call__(self, answer: bytes, request: Request | None) -> bytes:
        status = status_of(answer)
        self._metrics.rejected(status)
        sent = None if request is None else find_header(request.headers, b"x-request-id")
        request_id = sent or self._new_id()
        access = self._access
        if access.wants(True):
            body = len(answer) - answer.index(b"\r\n\r\n") - 4
            access.write(refusal_entry(request, request_id, "-", status, 0.0, body))
        return with_header(answer, b"x-request-id: %s\r\n" % request_id)
