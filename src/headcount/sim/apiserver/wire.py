"""The emulator's HTTP vocabulary: query parameters as the real server parses them, JSON answers.

Query values follow Go's parsers (``strconv.ParseBool``, unsigned 64-bit
resourceVersions), so a request the real server refuses is refused here too.
"""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from headcount.sim.apiserver.objects import JsonObject
from headcount.sim.apiserver.status import StatusError, bad_request

__all__ = [
    "NUMBER",
    "json_body",
    "json_line",
    "json_response",
    "parse_bool",
    "parse_version",
    "status_response",
]

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
NUMBER = re.compile(r"[0-9]{1,19}")
"""A resourceVersion or timeoutSeconds: an unsigned 64-bit integer, as the real server parses it."""


def parse_bool(name: str, value: str | None) -> bool:
    if value is None or value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise bad_request(f"{name}: invalid boolean {value!r}")


def parse_version(value: str | None) -> int | None:
    """A request's resourceVersion: None when absent, empty or "0" ("any version")."""
    if not value or value == "0":
        return None
    if not NUMBER.fullmatch(value):
        raise bad_request(f"resourceVersion: Invalid value: {value!r}: must be a number")
    return int(value)


async def json_body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc


def json_line(body: JsonObject) -> bytes:
    """One watch event on the wire: compact JSON and a newline."""
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def json_response(body: JsonObject, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
    )


def status_response(error: StatusError) -> web.Response:
    return json_response(error.to_status(), error.code)
