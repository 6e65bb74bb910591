"""The access log: one line per proxied request, sampled so a busy router can afford it.

Logger `headcount.access`, at INFO. Every request that did not go well (any
non-2xx answer, the HTTP layer's own refusals included, a stream cut, a
failover, a stream resumed) gets a line; of the others, one in
`round(1 / sample)` does (`--access-log-sample`; 0 turns the log off, 1 logs
every request). The sampling is decided first, by a countdown (no clock, no
random draw) drawn when a 2xx answer's head arrives (so that the tokens it reports
can be read for its line), and only a request that is logged builds its `AccessEntry`; the
text is formatted when a handler writes it. The fields also travel as the
record's `extra`, so a JSON formatter emits them as keys:

    request_id method path model engine status outcome ttfb_ms duration_ms
    bytes_in bytes_out failovers cut cached_tokens resumed_from tried tenant
    prompt_tokens completion_tokens

`model` is the model the request asked for (`-` before its body was read),
`engine` the name of the engine that answered (or was tried last; `-` for a
request no engine saw), `bytes_out` the response body bytes the client was
sent, `cached_tokens` the route receipt's predicted cached prompt tokens
(`kv-aware` only, else `-`), `resumed_from` the engines a resumed stream
broke on, comma-separated, in order (outcome `resumed`, or `cut` when the
last continuation broke too; else `-`). `tried` names every engine an attempt
failed on, in order, each with its failure (`engine-a:connect_failed,engine-b:503`;
`-` when none failed), `tenant` the client key's tenant (with client keys),
and the token counts are those the answer reported (`-` when it reported none, as a
stream that did not ask for its usage): flow control meters every answer, and without
it the answers drawn for a line and those after a failover are read.
"""

from __future__ import annotations

import json
import logging
from typing import Any

__all__ = ["AccessEntry", "AccessLog"]

_LOGGER = logging.getLogger("headcount.access")


class AccessEntry:
    """One request's line, formatted only when a handler writes it."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "cached_tokens",
        "cut",
        "duration",
        "engine",
        "failovers",
        "method",
        "model",
        "outcome",
        "path",
        "request_id",
        "resumed_from",
        "status",
        "tenant",
        "tokens",
        "tried",
        "ttfb",
    )

    def __init__(
        self,
        *,
        request_id: bytes,
        method: bytes,
        path: bytes,
        model: str,
        status: int,
        outcome: str,
        duration: float,
        bytes_in: int,
        bytes_out: int,
        engine: str | None = None,
        ttfb: float | None = None,
        failovers: int = 0,
        cut: bool = False,
        cached_tokens: int | None = None,
        resumed_from: str | None = None,
        tried: str | None = None,
        tenant: str | None = None,
        tokens: tuple[int | None, int | None] | None = None,
    ) -> None:
        """The defaults are a request no engine saw; `tokens`: (prompt, completion)."""
        self.request_id = request_id
        self.method = method
        self.path = path
        self.model = model
        self.engine = engine
        self.status = status
        self.outcome = outcome
        self.ttfb = ttfb
        self.duration = duration
        self.bytes_in = bytes_in
        self.bytes_out = bytes_out
        self.failovers = failovers
        self.cut = cut
        self.cached_tokens = cached_tokens
        self.resumed_from = resumed_from
        self.tried = tried
        self.tenant = tenant
        self.tokens = tokens

    def fields(self) -> dict[str, Any]:
        """The entry as plain values (the record's `extra`): times in milliseconds."""
        return {
            "request_id": self.request_id.decode("latin-1"),
            "method": self.method.decode("latin-1"),
            "path": self.path.decode("latin-1"),
            "model": self.model,
            "engine": self.engine,
            "status": self.status,
            "outcome": self.outcome,
            "ttfb_ms": None if self.ttfb is None else round(self.ttfb * 1000, 1),
            "duration_ms": round(self.duration * 1000, 1),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "failovers": self.failovers,
            "cut": self.cut,
            "cached_tokens": self.cached_tokens,
            "resumed_from": self.resumed_from,
            "tried": self.tried,
            "tenant": self.tenant,
            "prompt_tokens": None if self.tokens is None else self.tokens[0],
            "completion_tokens": None if self.tokens is None else self.tokens[1],
        }

    def __str__(self) -> str:
        return " ".join(
            f"{name}={'-' if value is None else _quoted(value)}"
            for name, value in self.fields().items()
        )


def _quoted(value: object) -> str:
    """logfmt: bare when safe, else a JSON string (client-chosen text cannot forge a field)."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if not text or not text.isprintable() or any(c in ' "=\\' for c in text):
        return json.dumps(text)
    return text


class AccessLog:
    """Which requests get a line, and writing it; see the module docstring."""

    __slots__ = ("_countdown", "_every", "_logger")

    def __init__(self, sample: float, logger: logging.Logger = _LOGGER) -> None:
        """`sample` within 0-1: the share of requests that went well given a line."""
        self._every = 0 if sample <= 0 else max(1, round(1 / sample))
        self._countdown = self._every
        self._logger = logger

    def draw(self) -> bool:
        """Whether a request whose 2xx answer begins now is the one in N given a line should
        it end well. Drawn once per such answer, when its head arrives."""
        if not self._every:
            return False
        self._countdown -= 1
        if self._countdown:
            return False
        self._countdown = self._every
        return True

    def wants(self, chosen: bool) -> bool:
        """Whether a request gets a line: when `chosen` (it did not go well, or `draw` chose
        it) and the log is on. Called once per request, before anything is built."""
        return chosen and self._every != 0 and self._logger.isEnabledFor(logging.INFO)

    def write(self, entry: AccessEntry) -> None:
        """Log `entry` (after `wants` said yes)."""
        self._logger.info("%s", entry, extra=entry.fields())
