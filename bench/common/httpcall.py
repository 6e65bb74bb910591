"""One blocking HTTP request, its whole answer read: how a benchmark asks a process something."""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["HttpAnswer", "http_call", "ok"]


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def ok(answer: HttpAnswer | None) -> bool:
    """An answer came, and it is a 2xx."""
    return answer is not None and answer.ok


def http_call(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    timeout_s: float = 5.0,
    host: str = "127.0.0.1",
    headers: Mapping[str, str] | None = None,
) -> HttpAnswer | None:
    """One request to `host`:`port`, whole body read (chunked decoded); None if unreachable.
    `headers` are sent besides a JSON `Content-Type` when there is a body."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    sent = {"Content-Type": "application/json"} if body is not None else {}
    sent.update(headers or {})
    try:
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        return HttpAnswer(response.status, response.read())
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
