"""Admission: what a proxied request asks for, and which engine takes it, or why none does.

What routing needs of the JSON body (`model` and, only for a policy that asks
through `Policy.key_source`, its affinity key) is read by `payload.py`: here on
the loop for a small body (`admit`), in a worker process for a large one
(`parsepool.py`, then `admit_read`); the body itself is forwarded byte for
byte. The policy picks among `snapshot.candidates(model)`. The result is typed:
`Admitted` (the engine and the request's features) or `Refused` (the answer to
send and the model label to count it under). For the `kv-aware` policy the
features carry the prompt (`routing.kv.KvRequest`): `PromptAdmission` gets its
token ids first (`routing.kv.prompts`), with the router's tokenizer on the loop
for a body up to `KvRouting.inline_tokenize_max`, else from one candidate's
`POST /tokenize` (`AskEngine`: the data plane awaits it in a task, as it
awaits a worker's parse); a body with no ids to be had is routed by load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from headcount._http.handler import Request
from headcount._http.pool import Upstreams
from headcount.fleet import Engine, Fleet, Snapshot
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
from headcount.routing import LeastLoaded, Policy, RequestFeatures
from headcount.routing.kv import KvAware
from headcount.routing.kv.prompts import EngineTokenize, local_ids
from headcount.surfaces.metrics import UNKNOWN_MODEL
from headcount.tokens import PromptKind

__all__ = ["Admitted", "AskEngine", "PromptAdmission", "Refused", "admit", "admit_read"]


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


_PROMPT_KINDS: dict[bytes, PromptKind] = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "completion",
}


class AskEngine(NamedTuple):
    """A request whose prompt ids an engine's `/tokenize` must give first."""

    body: dict[str, Any]
    kind: PromptKind


class PromptAdmission:
    """Admission for the `kv-aware` policy: the prompt's token ids, then the policy."""

    def __init__(self, kv: KvAware, upstreams: Upstreams) -> None:
        routing = kv.routing
        self._kv = kv
        self._tokenizer = routing.tokenizer
        self._inline_max = routing.inline_tokenize_max
        self._engines = EngineTokenize(
            upstreams, timeout=routing.tokenize_timeout, answer_max=routing.tokenize_answer_max
        )
        self._least_loaded = LeastLoaded()

    def admit(self, request: Request, snapshot: Snapshot) -> Admitted | Refused | AskEngine:
        """Route `request` now, or say which body an engine must tokenize first (`asked`)."""
        kv, body = self._kv, payload.parse_request(request.body)
        if isinstance(body, str):
            return admit_read(body, snapshot, kv, kv)
        kind = _PROMPT_KINDS.get(request.path)
        if kind is None:
            return admit_read((body["model"], None), snapshot, kv, kv)
        tokenizer = self._tokenizer
        if tokenizer is None:
            return AskEngine(body, kind)
        ids = None
        if len(request.body) <= self._inline_max:
            ids = local_ids(body, kind, tokenizer)
        return admit_read((body["model"], None), snapshot, kv, kv, ids)

    async def asked(self, ask: AskEngine, fleet: Fleet) -> Admitted | Refused:
        """Route after asking the least-loaded candidate for the prompt's ids."""
        model: str = ask.body["model"]
        candidates = fleet.snapshot.candidates(model)
        engine = self._least_loaded.select(candidates, RequestFeatures(model))
        ids = None if engine is None else await self._engines.ids(engine, ask.body, ask.kind)
        return admit_read((model, None), fleet.snapshot, self._kv, self._kv, ids)
