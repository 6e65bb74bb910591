"""What the proxy answers when it cannot forward: the error catalogue and why no engine fits.

Every answer is OpenAI-shaped JSON (`{"error": {"message", "type", "code"}}`),
rendered once where it is constant. `unroutable` tells apart a model nobody
serves (404, when the fleet works) from a fleet that cannot serve right now
(503, saying which engines exist and in what state).
"""

from __future__ import annotations

from typing import NamedTuple

from headcount._http.wire import INTERNAL_ERROR_BODY, error_body
from headcount.fleet import Snapshot
from headcount.surfaces.metrics import UNKNOWN_MODEL

__all__ = [
    "BODY_TOO_COMPLEX",
    "BODY_UNREADABLE_NOW",
    "INTERNAL_ERROR",
    "INVALID_API_KEY",
    "INVALID_JSON",
    "INVALID_UNICODE",
    "JSON_TOO_DEEP",
    "MISSING_API_KEY",
    "MISSING_MODEL",
    "NOT_AN_OBJECT",
    "ErrorAnswer",
    "no_engine",
    "outside_subset",
    "overloaded",
    "unroutable",
    "upstream_failed",
    "upstream_timed_out",
]


class ErrorAnswer(NamedTuple):
    """A status and its OpenAI-shaped JSON body."""

    status: int
    body: bytes


def _answer(status: int, message: str, error_type: str, code: str) -> ErrorAnswer:
    return ErrorAnswer(status, error_body(message, error_type, code))


INVALID_JSON = _answer(
    400, "request body is not valid JSON", "invalid_request_error", "invalid_json"
)
INVALID_UNICODE = _answer(
    400,
    "request body holds a lone UTF-16 surrogate (a `\\ud800`-`\\udfff` escape outside a pair), "
    "which is no Unicode text: strings must be valid Unicode",
    "invalid_request_error",
    "invalid_unicode",
)
NOT_AN_OBJECT = _answer(
    400, "request body must be a JSON object", "invalid_request_error", "invalid_request"
)
MISSING_MODEL = _answer(
    400, "request body must name a `model` (a string)", "invalid_request_error", "missing_model"
)
INTERNAL_ERROR = ErrorAnswer(500, INTERNAL_ERROR_BODY)
JSON_TOO_DEEP = _answer(
    400, "request body is JSON nested too deeply", "invalid_request_error", "invalid_json"
)
BODY_TOO_COMPLEX = _answer(
    413,
    "request body is too complex to read within the router's memory bound",
    "invalid_request_error",
    "request_too_large",
)
BODY_UNREADABLE_NOW = _answer(
    503, "the router could not read the request body right now", "service_unavailable", "overloaded"
)
MISSING_API_KEY = _answer(
    401,
    "no API key: send it as `Authorization: Bearer <key>`",
    "invalid_request_error",
    "invalid_api_key",
)
INVALID_API_KEY = _answer(401, "invalid API key", "invalid_request_error", "invalid_api_key")
"""Never quotes the key presented."""


def no_engine(message: str) -> ErrorAnswer:
    return _answer(503, message, "service_unavailable", "no_engine_available")


def outside_subset(model: str) -> ErrorAnswer:
    """No engine for `model` among those a gateway allows (the endpoint picker's subset hint)."""
    return no_engine(f"no engine serving `{model}` is among the endpoints the gateway allows")


def overloaded(message: str) -> ErrorAnswer:
    """The router itself is out of a resource: no engine is to blame, try again later."""
    return _answer(503, message, "service_unavailable", "overloaded")


def upstream_timed_out(detail: str, tried: int) -> ErrorAnswer:
    message = f"upstream engine timed out ({detail}); tried {tried} engine(s)"
    return _answer(504, message, "upstream_error", "upstream_timeout")


def upstream_failed(reason: str, detail: str, tried: int) -> ErrorAnswer:
    message = f"upstream engine failed ({reason}: {detail}); tried {tried} engine(s)"
    return _answer(502, message, "upstream_error", "upstream_failed")


def unroutable(snapshot: Snapshot, model: str, why_none: str = "") -> tuple[ErrorAnswer, str]:
    """Why no engine takes `model`, and the model label to count it under.

    404 if the fleet works and nobody knows the model, else 503, saying `why_none` (health's
    reason why no engine is routable, computed when health changes) when there is one.
    """
    if not snapshot.is_known(model):
        if snapshot.routable:
            message = f"The model `{model}` does not exist."
            return _answer(404, message, "invalid_request_error", "model_not_found"), UNKNOWN_MODEL
        total = len(snapshot.engines)
        why = why_none or (
            f"none of the fleet's {total} engine(s) is ready" if total else "the fleet is empty"
        )
        return no_engine(f"no engine available for model `{model}`: {why}"), UNKNOWN_MODEL
    serving = [
        engine
        for engine in snapshot.engines
        if model in engine.served or engine.spec.model_label == model
    ]
    states: dict[str, int] = {}
    for engine in serving:
        state = "ejected" if engine.id in snapshot.ejected else engine.state.value
        states[state] = states.get(state, 0) + 1
    summary = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    message = f"no routable engine serves model `{model}` right now (engines: {summary})"
    return no_engine(message), model
