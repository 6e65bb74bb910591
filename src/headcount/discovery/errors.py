"""What can go wrong listing or watching Kubernetes, as one small tree a reflector acts on.

`kube.py` translates the client's exceptions into this tree; a `Reflector`
decides from it whether to relist at once or back off first:

    KubeError
    ├── ApiUnreachable      connection refused, reset or broken mid-stream
    │   └── ApiTimeout      no answer within the client-side timeout
    ├── ApiStatusError      a non-2xx answer or an in-stream ERROR event (`.code`)
    │   └── WatchExpired    410 Gone: the resourceVersion left the server's history
    ├── WatchIdle           nothing (no event, bookmark or byte) for the idle timeout
    └── BadResponse         a body or watch line that is not the expected JSON
"""

from __future__ import annotations

__all__ = [
    "ApiStatusError",
    "ApiTimeout",
    "ApiUnreachable",
    "BadResponse",
    "KubeError",
    "WatchExpired",
    "WatchIdle",
]


class KubeError(Exception):
    """Listing or watching failed; the message says what and why, for `status.last_error`."""


class ApiUnreachable(KubeError):
    """No usable connection: refused, reset, or broken mid-stream."""


class ApiTimeout(ApiUnreachable):
    """The API server did not answer within the client-side timeout."""


class ApiStatusError(KubeError):
    """The API server answered with an error status (403, 429, 500...)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class WatchExpired(ApiStatusError):
    """410 Gone: the requested resourceVersion is older than the server's history."""

    def __init__(self, message: str) -> None:
        super().__init__(410, message)


class WatchIdle(KubeError):
    """The watch stream was silent for the idle timeout: stalled or half-open."""


class BadResponse(KubeError):
    """The server sent something that is not the JSON we expect."""
