"""Admission: what a proxied request asks for, and which engine takes it, or why none does.

What routing needs of the JSON body (`model` and, only for a policy that asks
through `Policy.key_source`, its affinity key) is read by `payload.py`: here on
the loop for a small body (`admit`), in a worker process for a large one
(`parsepool.py`, then `admit_read`); the body itself is forwarded byte for
byte. The policy picks among `snapshot.candidates(model)`. The result is typed:
`Admitted` (the engine and the request's features) or `Refused` (the answer to
send and the model label to count it under). For the `kv-aware` policy the
features carry the prompt (`kvroute.KvRequest`), tokenized by the data plane.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from headcount._http.handler import Request
from headcount.fleet import Engine, Snapshot
from headcount.kvroute import KvAware
from headcount.metrics import UNKNOWN_MODEL
from headcount.proxy import payload
from headcount.proxy.errors import (
    BODY_TOO_COMPLEX,
    BODY_UNREADABLE_NOW,
    INTERNAL_ERROR,
    INVALID_JSON,
    JSON_TOO_DEEP,
    MISSING_MODEL,
    NOT_AN_OBJECT,
    ErrorAnswer,
    no_engine,
    unroutable,
)
from headcount.proxy.headers import find_header
from headcount.routing import Policy, RequestFeatures

__all__ = ["Admitted", "Refused", "admit", "admit_read"]


class Admitted(NamedTuple):
    """The engine to try first; `features` choose the next ones on failover."""

    engine: Engine
    features: RequestFeatures


class Refused(NamedTuple):
    """The answer for a request no engine takes, and its `model` metric label."""

    answer: ErrorAnswer
    label: str


_REFUSALS = {
    code: Refused(answer, UNKNOWN_MODEL)
    for code, answer in (
        (payload.INVALID_JSON, INVALID_JSON),
        (payload.TOO_DEEP, JSON_TOO_DEEP),
        (payload.NOT_AN_OBJECT, NOT_AN_OBJECT),
        (payload.MISSING_MODEL, MISSING_MODEL),
        (payload.TOO_COMPLEX, BODY_TOO_COMPLEX),
        (payload.UNAVAILABLE, BODY_UNREADABLE_NOW),
        (payload.INTERNAL, INTERNAL_ERROR),
    )
}


def admit(request: Request, snapshot: Snapshot, policy: Policy) -> Admitted | Refused:
    """Route `request` within `snapshot` with `policy`, reading its body here and now."""
    headers = request.headers
    read = payload.read_payload(
        request.body, policy.key_source, lambda name: find_header(headers, name)
    )
    return admit_read(read, snapshot, policy)


def admit_read(
    read: payload.Outcome,
    snapshot: Snapshot,
    policy: Policy,
    kv: KvAware | None = None,
    prompt: Sequence[int] | None = None,
) -> Admitted | Refused:
    """Route a request whose body was read already (`read` is `payload`'s outcome); for the
    `kv-aware` policy (`kv`), with its prompt's token ids if known."""
    if isinstance(read, str):
        return _REFUSALS[read]
    model, key = read
    candidates = snapshot.candidates(model)
    if not candidates:
        return Refused(*unroutable(snapshot, model))
    features = RequestFeatures(model, key, None if kv is None else kv.request(model, prompt))
    engine = policy.select(candidates, features)
    if engine is None:
        return Refused(no_engine(f"the routing policy chose no engine for `{model}`"), model)
    return Admitted(engine, features)
