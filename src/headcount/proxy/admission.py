"""Admission: which engine takes a proxied request, or why none does, or what to await first.

One entry, `Admission.admit(request)`, and one typed result for every path:
`Admitted` (the engine and the request's features), `Refused` (the answer to
send and the model label to count it under), or `Later`, an awaitable that
yields one of those two. The data plane awaits a `Later` in a task the
client's leaving cancels; it sees what to await, never why, so another reason
to wait is one more `Later`, not one more branch in the data plane.

What routing needs of the JSON body (`model` and, only for a policy that asks
through `Policy.key_source`, its affinity key) is read by `payload.py`: on the
loop for a body up to `inline_parse_max`, else in a worker process
(`parsepool.py`, a `Later`), so that no body stalls the loop; the body itself
is forwarded byte for byte. The policy then picks among
`fleet.snapshot.candidates(model)`, a decision with no I/O (`_route`); for a request a
gateway restricts (`Request.subset`, the endpoint picker's subset hint), among those of
them the gateway allows, refused 503 when none is. Two paths say more
than `model` and are read here first (`_admit_read_here`): an audio upload's
`model` is a form field (`multipart.py`), and a Responses create naming a
`previous_response_id` goes to the engine storing that response alone
(`stored_responses.py`, `PinnedFeatures`), or is refused saying why
it cannot; `stored` places a stored response's `GET` and cancel the same way.

For the `kv-aware` policy the features carry the prompt (`routing.kv.KvRequest`):
its token ids come first (`routing.kv.prompts`), from the router's tokenizer on
the loop for a body up to `KvRouting.inline_tokenize_max`, else from one
candidate's `POST /tokenize` (a `Later`); a body with no ids to be had (read
by a worker, too large to tokenize on the loop, or no answer from the engine)
is routed by load. Tokenizing costs; a request no engine takes is refused
before any (the key is checked before admission, by the data plane).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from headcount._http.handler import Request
from headcount._http.pool import Upstreams
from headcount._http.wire import JSON_HEADER, error_body
from headcount.auth import Credentials
from headcount.config import ProxySettings
from headcount.fleet import Engine, Fleet
from headcount.flow.control import FlowControl
from headcount.flow.ticket import Decision, Refusal, Ticket
from headcount.proxy import multipart, payload
from headcount.proxy.demand import refusal_answer, ticket_of
from headcount.proxy.errors import (
    BODY_TOO_COMPLEX,
    BODY_UNREADABLE_NOW,
    INTERNAL_ERROR,
    INVALID_JSON,
    INVALID_UNICODE,
    JSON_TOO_DEEP,
    MISSING_MODEL,
    NOT_AN_OBJECT,
    ErrorAnswer,
    no_engine,
    outside_subset,
    unroutable,
)
from headcount.proxy.headers import find_header
from headcount.proxy.parsepool import ParsePool
from headcount.proxy.paths import FORM_PATHS, RESPONSES
from headcount.proxy.stored_responses import (
    FOLLOWED,
    StoredResponses,
    follow,
    not_found,
    refusal,
)
from headcount.routing import HeaderLookup, PinnedFeatures, Policy, RequestFeatures
from headcount.routing.affinity import previous_response_key
from headcount.routing.kv import KvAware
from headcount.routing.kv.prompts import EngineTokenize, local_ids
from headcount.routing.kv.tokenize_turns import TokenizeTurns
from headcount.surfaces.metrics import UNKNOWN_MODEL
from headcount.tokens import PromptKind

__all__ = ["Admission", "Admitted", "Later", "Refused"]


@dataclass(slots=True)
class Admitted:
    """The engine to try first; `features` choose the next ones on failover. A compiled
    dataclass, made as a native object: a NamedTuple's `__new__` is interpreted."""

    engine: Engine
    features: RequestFeatures
    ticket: Ticket | None = None
    """Flow control's hold, given back at the request's end (None: flow control off)."""
    body: bytes | None = None
    """The body to forward when it is not the client's (usage asked for)."""


class Refused(NamedTuple):
    """The answer for a request no engine takes, and its `model` metric label."""

    answer: ErrorAnswer
    label: str
    headers: bytes = JSON_HEADER
    """The answer's header lines."""
    model: str = ""
    """The model asked for, for the access log (`label` may be `unknown` for metrics)."""


class Later(NamedTuple):
    """A decision that must be awaited first (a worker's parse, an engine's `/tokenize`)."""

    decision: Awaitable[Admitted | Refused]


class Admission:
    """Every proxied request's way to an engine; see the module docstring."""

    def __init__(
        self,
        fleet: Fleet,
        policy: Policy,
        settings: ProxySettings,
        upstreams: Upstreams,
        credentials: Credentials | None = None,
        flow: FlowControl | None = None,
        stored: StoredResponses | None = None,
    ) -> None:
        """Routes within `fleet`'s snapshot with `policy`; large bodies are read by a pool of
        `settings.parse_workers`; `upstreams` carry the `kv-aware` policy's `/tokenize`, with
        the `Authorization` `credentials` give forwarded requests (None: the client's).
        `flow` (with a tenants file) decides when and whether each request goes on.
        `stored`: where Responses API responses are stored (None: a map of its own)."""
        self._fleet = fleet
        self._stored = StoredResponses() if stored is None else stored
        self._policy = policy
        self._flow = flow
        self._credentials = credentials or Credentials()
        self._inline_parse_max = settings.inline_parse_max
        self._parser = ParsePool(settings.parse_workers, settings.parse_worker_memory)
        self._kv = policy if isinstance(policy, KvAware) else None
        self._prompts = (
            None if self._kv is None else _Prompts(self._kv, upstreams, self._credentials)
        )

    def admit(self, request: Request) -> Admitted | Refused | Later:
        """Route `request` now, or say what to await for its route."""
        if request.path in _READ_HERE:
            return self._admit_read_here(request)
        if len(request.body) > self._inline_parse_max:
            # Parsing a large body could stall the loop: a worker process reads it.
            return Later(self._read_large(request))
        prompts = self._prompts
        if prompts is not None:
            return prompts.admit(request, self._fleet, self._flow, self._credentials)
        body = payload.parse_request(request.body)
        if isinstance(body, str):
            return _REFUSALS[body]
        return self._by_policy(request, body, body["model"])

    def _by_policy(
        self, request: Request, body: dict[str, Any], model: str, prompt: int | None = None
    ) -> Admitted | Refused | Later:
        """The policy's route for a body read on the loop (`body`: its JSON, or only the
        model of a form); `prompt`, the tokens flow control reserves for the prompt when
        not its body's bytes (an upload's)."""
        policy, source, flow = self._policy, self._policy.key_source, self._flow
        key = None
        if source is not None:
            headers = request.headers
            key = source(body, lambda name: find_header(headers, name))
        ticket = None if flow is None else ticket_of(flow, self._credentials, request, body, model)
        if ticket is not None and prompt is not None:
            ticket.prompt = prompt
        subset = request.subset
        return _route((model, key), self._fleet, policy, self._kv, ticket=ticket, subset=subset)

    def stored(self, response_id: str) -> Admitted | Refused:
        """`GET /v1/responses/{id}` and its cancel: to the engine storing the response, or the
        answer saying why not (no flow control: nothing is generated)."""
        stored = self._stored.find(response_id)
        if stored is None:
            return Refused(not_found(response_id), UNKNOWN_MODEL)
        snapshot = self._fleet.snapshot
        engine = follow(snapshot, stored, stored.model)
        if isinstance(engine, str):
            self._stored.count(engine)
            return Refused(refusal(engine, response_id, stored, snapshot), stored.model)
        self._stored.count(FOLLOWED)
        return Admitted(engine, PinnedFeatures(stored.model))

    def _admit_read_here(self, request: Request) -> Admitted | Refused | Later:
        """The paths whose body says more than `model`: an audio upload's form, a Responses
        create that may continue a stored response (`previous_response_id`)."""
        if request.path != RESPONSES:
            model = multipart.form_model(
                find_header(request.headers, b"content-type"), request.body
            )
            refused = _FORM_REFUSALS.get(model)
            if refused is not None:
                return refused
            # Audio is no text: only the transcript's tokens are reserved, settled on usage.
            return self._by_policy(request, {"model": model}, model, prompt=0)
        if len(request.body) > self._inline_parse_max:
            return Later(self._read_large_response(request))
        body = payload.parse_request(request.body)
        if isinstance(body, str):
            return _REFUSALS[body]
        model = body["model"]
        previous = previous_response_key(body, _NO_HEADER)
        if previous is not None:
            return self._continuing(previous, model, request, body)
        prompts = self._prompts
        if prompts is not None:
            return prompts.admit(request, self._fleet, self._flow, self._credentials)
        return self._by_policy(request, body, model)

    def _continuing(
        self, previous: str, model: str, request: Request, body: dict[str, Any] | None
    ) -> Admitted | Refused | Later:
        """A Responses create continuing `previous`: to its engine alone, refused when that
        engine cannot take it, routed by `model` when the id is unknown here."""
        stored = self._stored.find(previous)
        snapshot, flow = self._fleet.snapshot, self._flow
        engine = None if stored is None else follow(snapshot, stored, model)
        if stored is not None and isinstance(engine, str):
            self._stored.count(engine)
            return Refused(refusal(engine, previous, stored, snapshot), model)
        ticket = None if flow is None else ticket_of(flow, self._credentials, request, body, model)
        fleet, policy, kv, subset = self._fleet, self._policy, self._kv, request.subset
        if not isinstance(engine, Engine):
            return _route((model, None), fleet, policy, kv, ticket=ticket, subset=subset)
        if subset is not None and engine.spec.endpoint() not in subset:
            return Refused(outside_subset(model), model)
        self._stored.count(FOLLOWED)
        return _select(model, None, (engine,), self._policy, self._kv, None, ticket, pinned=True)

    async def _read_large_response(self, request: Request) -> Admitted | Refused:
        """A large Responses create, read by a worker for its model and previous response."""
        read = await self._parser.read(
            request.body, previous_response_key, request.headers, request.client
        )
        if isinstance(read, str):
            return _REFUSALS[read]
        model, previous = read
        if previous is not None:
            return await _decided(self._continuing(previous, model, request, None))
        flow = self._flow
        ticket = None if flow is None else ticket_of(flow, self._credentials, request, None, model)
        fleet, policy, kv, subset = self._fleet, self._policy, self._kv, request.subset
        routed = _route((model, None), fleet, policy, kv, ticket=ticket, subset=subset)
        return await _decided(routed)

    async def close(self) -> None:
        """Stop the body-parsing workers; a request still waiting for one is refused (503)."""
        await self._parser.close()

    async def _read_large(self, request: Request) -> Admitted | Refused:
        policy, flow = self._policy, self._flow
        read = await self._parser.read(
            request.body, policy.key_source, request.headers, request.client
        )
        ticket = None
        if flow is not None and not isinstance(read, str):
            ticket = ticket_of(flow, self._credentials, request, None, read[0])
        routed = _route(read, self._fleet, policy, self._kv, ticket=ticket, subset=request.subset)
        return await _decided(routed)


_NO_HEADER: HeaderLookup = lambda _name: None  # noqa: E731
_READ_HERE = frozenset({RESPONSES, *FORM_PATHS})
"""Paths whose body admission reads itself (`_admit_read_here`)."""
_FORM_REFUSALS = {
    code: Refused(
        ErrorAnswer(400, error_body(message, "invalid_request_error", code)), UNKNOWN_MODEL
    )
    for code, message in multipart.PROBLEMS.items()
}

_REFUSALS = {
    code: Refused(answer, UNKNOWN_MODEL)
    for code, answer in (
        (payload.INVALID_JSON, INVALID_JSON),
        (payload.TOO_DEEP, JSON_TOO_DEEP),
        (payload.INVALID_UNICODE, INVALID_UNICODE),
        (payload.NOT_AN_OBJECT, NOT_AN_OBJECT),
        (payload.MISSING_MODEL, MISSING_MODEL),
        (payload.TOO_COMPLEX, BODY_TOO_COMPLEX),
        (payload.UNAVAILABLE, BODY_UNREADABLE_NOW),
        (payload.INTERNAL, INTERNAL_ERROR),
    )
}


def _route(
    read: payload.Outcome,
    fleet: Fleet,
    policy: Policy,
    kv: KvAware | None = None,
    prompt: Sequence[int] | None = None,
    *,
    ticket: Ticket | None = None,
    subset: frozenset[str] | None = None,
) -> Admitted | Refused | Later:
    """The policy's decision for a body already read (`read` is `payload`'s outcome); for
    the `kv-aware` policy (`kv`), with its prompt's token ids if known. No I/O; a wait only
    for flow control (`ticket`). A refusal says why no engine is routable, as health judged.
    `subset`: the only engines the request may go to (`Request.subset`), None: any."""
    if isinstance(read, str):
        return _REFUSALS[read]
    model, key = read
    candidates = _candidates(fleet, model, subset)
    if isinstance(candidates, Refused):
        return candidates
    return _select(model, key, candidates, policy, kv, prompt, ticket)


def _candidates(
    fleet: Fleet, model: str, subset: frozenset[str] | None
) -> Sequence[Engine] | Refused:
    """The engines that may take a request for `model` (within `subset`), or why none may."""
    snapshot = fleet.snapshot
    candidates: Sequence[Engine] = snapshot.candidates(model)
    if not candidates:
        return Refused(*unroutable(snapshot, model, fleet.unroutable_reason), model=model)
    if subset is not None:
        candidates = [engine for engine in candidates if engine.spec.endpoint() in subset]
        if not candidates:
            return Refused(outside_subset(model), model)
    return candidates


def _select(
    model: str,
    key: str | None,
    candidates: Sequence[Engine],
    policy: Policy,
    kv: KvAware | None,
    prompt: Sequence[int] | None,
    ticket: Ticket | None = None,
    *,
    pinned: bool = False,
) -> Admitted | Refused | Later:
    """The policy's choice among `candidates` (not empty) for `model`; with flow control
    (`ticket`), among those with room, or later, or refused. `pinned`: only these candidates
    can answer (`PinnedFeatures`)."""
    kv_request = None if kv is None else kv.request(model, prompt)
    features = (PinnedFeatures if pinned else RequestFeatures)(model, key, kv_request)
    if ticket is None:
        engine = policy.select(candidates, features)
        if engine is None:
            return Refused(no_engine(f"the routing policy chose no engine for `{model}`"), model)
        return Admitted(engine, features)
    if prompt is not None:
        ticket.prompt = len(prompt)
    decided: Decision = ticket.control.admit(ticket, candidates, policy, features)
    if isinstance(decided, (Ticket, Refusal)):
        return _granted(decided, features)
    return Later(_granted_later(decided, features))


def _granted(decided: Ticket | Refusal, features: RequestFeatures) -> Admitted | Refused:
    """Flow control's answer as admission's: the granted engine, or the refusal's answer."""
    if isinstance(decided, Refusal):
        answer, headers = refusal_answer(decided)
        return Refused(answer, features.model, headers)
    return Admitted(decided.engine, features, decided, decided.forward)


async def _granted_later(
    decided: Awaitable[Ticket | Refusal], features: RequestFeatures
) -> Admitted | Refused:
    return _granted(await decided, features)


async def _decided(decision: Admitted | Refused | Later) -> Admitted | Refused:
    """`decision`, awaited if it is a `Later`."""
    if isinstance(decision, Later):
        return await decision.decision
    return decision


_PROMPT_KINDS: dict[bytes, PromptKind] = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "completion",
}


class _Prompts:
    """The `kv-aware` policy's part of admission: the prompt's token ids, then the policy."""

    def __init__(self, kv: KvAware, upstreams: Upstreams, credentials: Credentials) -> None:
        routing = kv.routing
        self._kv = kv
        self._tokenizer = routing.tokenizer
        self._inline_max = routing.inline_tokenize_max
        self._engines = EngineTokenize(
            upstreams,
            credentials,
            TokenizeTurns(),
            timeout=routing.tokenize_timeout,
            answer_max=routing.tokenize_answer_max,
        )

    def admit(
        self,
        request: Request,
        fleet: Fleet,
        flow: FlowControl | None,
        credentials: Credentials,
    ) -> Admitted | Refused | Later:
        """Route a body small enough to read here, asking an engine for its ids if need be;
        a model no engine takes is refused before any tokenizing."""
        kv, body = self._kv, payload.parse_request(request.body)
        if isinstance(body, str):
            return _REFUSALS[body]
        model: str = body["model"]
        candidates = _candidates(fleet, model, request.subset)
        if isinstance(candidates, Refused):
            return candidates
        ticket = None if flow is None else ticket_of(flow, credentials, request, body, model)
        kind = _PROMPT_KINDS.get(request.path)
        if kind is None:
            return _select(model, None, candidates, kv, kv, None, ticket)
        tokenizer = self._tokenizer
        if tokenizer is None:
            return Later(self._asked(body, kind, candidates, request, fleet, ticket))
        ids = None
        if len(request.body) <= self._inline_max:
            ids = local_ids(body, kind, tokenizer)
        return _select(model, None, candidates, kv, kv, ids, ticket)

    async def _asked(
        self,
        body: dict[str, Any],
        kind: PromptKind,
        candidates: Sequence[Engine],
        request: Request,
        fleet: Fleet,
        ticket: Ticket | None,
    ) -> Admitted | Refused:
        """Route after asking one of `candidates` for the prompt's ids (the fleet may have
        changed meanwhile: routed within its snapshot then)."""
        ids = await self._engines.ids(
            candidates,
            body,
            kind,
            body_size=len(request.body),
            authorization=find_header(request.headers, b"authorization"),
        )
        read, kv, subset = (body["model"], None), self._kv, request.subset
        return await _decided(_route(read, fleet, kv, kv, ids, ticket=ticket, subset=subset))
