"""Admission: what a proxied request asks for, and which engine takes it, or why none does.

The JSON body is parsed once, to read `model` and, only for a policy that asks
(`Policy.key_source`), its affinity key; the body itself is forwarded byte for
byte. The policy picks among `snapshot.candidates(model)`. The result is typed:
`Admitted` (the engine and the request's features) or `Refused` (the answer to
send and the model label to count it under).
"""

from __future__ import annotations

import json
from typing import NamedTuple

from headcount._http.handler import Request
from headcount.fleet import Engine, Snapshot
from headcount.metrics import UNKNOWN_MODEL
from headcount.proxy.errors import (
    INVALID_JSON,
    MISSING_MODEL,
    NOT_AN_OBJECT,
    ErrorAnswer,
    no_engine,
    unroutable,
)
from headcount.proxy.headers import find_header
from headcount.routing import Policy, RequestFeatures

__all__ = ["Admitted", "Refused", "admit"]


class Admitted(NamedTuple):
    """The engine to try first; `features` choose the next ones on failover."""

    engine: Engine
    features: RequestFeatures


class Refused(NamedTuple):
    """The answer for a request no engine takes, and its `model` metric label."""

    answer: ErrorAnswer
    label: str


_INVALID_JSON = Refused(INVALID_JSON, UNKNOWN_MODEL)
_NOT_AN_OBJECT = Refused(NOT_AN_OBJECT, UNKNOWN_MODEL)
_MISSING_MODEL = Refused(MISSING_MODEL, UNKNOWN_MODEL)


def admit(request: Request, snapshot: Snapshot, policy: Policy) -> Admitted | Refused:
    """Route `request` within `snapshot` with `policy`."""
    try:
        payload = json.loads(request.body)
    except ValueError:
        return _INVALID_JSON
    if not isinstance(payload, dict):
        return _NOT_AN_OBJECT
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        return _MISSING_MODEL
    candidates = snapshot.candidates(model)
    if not candidates:
        return Refused(*unroutable(snapshot, model))
    key_source = policy.key_source
    key = None
    if key_source is not None:
        key = key_source(payload, lambda name: find_header(request.headers, name))
    features = RequestFeatures(model, key)
    engine = policy.select(candidates, features)
    if engine is None:
        return Refused(no_engine(f"the routing policy chose no engine for `{model}`"), model)
    return Admitted(engine, features)
