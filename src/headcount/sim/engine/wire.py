"""The engine's bytes on the wire: compact JSON, OpenAI's error shape, the headers it stamps.

vLLM answers every refusal as ``{"error": {"message", "type", "code"}}``; a
router that forwards or inspects errors must see the same shape here.
"""

from __future__ import annotations

import json

from aiohttp import web
from multidict import istr

__all__ = [
    "ENGINE_NAME",
    "JSON",
    "REQUEST_ID",
    "RequestError",
    "bad_request",
    "error_body",
    "json_bytes",
]

ENGINE_NAME = istr("x-engine-name")
REQUEST_ID = istr("x-request-id")
JSON = "application/json"


def json_bytes(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def error_body(status: int, message: str, error_type: str) -> bytes:
    return json_bytes({"error": {"message": message, "type": error_type, "code": status}})


class RequestError(Exception):
    """A request the engine refuses, answered with an OpenAI-shaped error."""

    def __init__(self, status: int, message: str, error_type: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type

    def response(self) -> web.Response:
        body = error_body(self.status, str(self), self.error_type)
        return web.Response(status=self.status, body=body, content_type=JSON)


def bad_request(message: str) -> RequestError:
    return RequestError(400, message, "BadRequestError")
