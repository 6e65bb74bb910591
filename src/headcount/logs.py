"""Log set-up: one line per event, as text for people or JSON for log pipelines.

A line's facts travel twice: in words, in its message, and as fields passed with
`extra=` (`engine`, `source`, `reason`, `state`, `request_id`...). JSON mode
writes each field as a top-level key beside `time`, `level`, `logger` and
`message` (which a field cannot override); a value JSON cannot hold is written
as its `str`. Text mode writes the message alone: it already says what the
fields say, and a line stays readable.

Messages quote what others chose: an engine's model ids, a pod's labels, a
client's path. In text mode every control character of a message (line
breaks, ANSI escapes, C1 controls, Unicode line separators) is written as a
`\\xNN`-style escape, so a string cannot end the line and forge another, or
recolour a terminal; a traceback still follows the message on lines of its own.
JSON mode escapes them by being JSON.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["configure_logging"]

_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
"""What every record carries: whatever else it has came with `extra=`."""


_CONTROLS = {
    code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if code != 0x09
} | {0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"}
"""What a text line writes in place of each control character (a tab stays a tab)."""


class _TextFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_CONTROLS)
        return super().formatMessage(record)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES:
                document.setdefault(key, value)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def configure_logging(fmt: str, level: str) -> None:
    """Send logs to stderr in `fmt` (`text` or `json`) at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
