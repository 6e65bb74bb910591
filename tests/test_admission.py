"""Admission through its one entry: an engine or an answer at once, or what to await first.

Small bodies are decided on the spot (`Admitted`, `Refused`); a large body is
read by a worker process and a `kv-aware` request with no router tokenizer asks
an engine's `/tokenize`, each a `Later` that yields the decision.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

from headcount._http.handler import Request
from headcount._http.pool import PoolOptions, Upstreams
from headcount._http.resolve import Resolver
from headcount.config import ProxySettings, RoutingName
from headcount.fleet import Engine, EngineLoad, EngineSpec, EngineState, Fleet, ProbeResult
from headcount.proxy.admission import Admission, Admitted, Later, Refused
from headcount.routing import (
    LeastLoaded,
    Policy,
    RequestFeatures,
    RoundRobin,
    make_policy,
    session_key,
)
from headcount.routing.kv import KvRouting
from headcount.surfaces.metrics import UNKNOWN_MODEL
from headcount.tokens import ChatTokenizer, builtin_tokenizer
from tests.kv_event_index import EventIndex
from tests.support import EngineConnection, raw_engine

SETTINGS = ProxySettings()
ON_THE_LOOP = ProxySettings(inline_parse_max=1024 * 1024)
"""Every body here read on the loop, the 100k-deep one too."""
TIMEOUT = 10.0


def engine(
    name: str, *models: str, state: EngineState = EngineState.READY, url: str = ""
) -> Engine:
    return Engine(
        spec=EngineSpec(id=name, name=name, url=url or f"http://{name}", source="t"),
        load=EngineLoad(),
        state=state,
        cards=tuple({"id": model} for model in models),
    )


def fleet_of(*engines: Engine) -> Fleet:
    """A fleet whose probes brought each of `engines` to its state."""
    built = Fleet(unhealthy_after=1)
    built.reconcile("t", [each.spec for each in engines])
    for each in engines:
        built.apply_probe(each.id, ProbeResult(ok=True, cards=each.cards))
        if each.state is EngineState.UNHEALTHY:
            built.apply_probe(each.id, ProbeResult(ok=False, error="down"))
    assert [each.state for each in built.snapshot.engines] == [each.state for each in engines]
    return built


def upstreams() -> Upstreams:
    return Upstreams(
        PoolOptions(
            connect_timeout=SETTINGS.connect_timeout,
            read_timeout=SETTINGS.read_timeout,
            idle_timeout=SETTINGS.pool_idle_timeout,
            max_idle=SETTINGS.pool_max_idle,
            max_head_size=SETTINGS.max_header_size,
            resolver=Resolver(1.0),
        )
    )


def admit(
    request: Request, fleet: Fleet, policy: Policy, settings: ProxySettings = SETTINGS
) -> Admitted | Refused | Later:
    return Admission(fleet, policy, settings, upstreams()).admit(request)


def request(
    body: bytes, *headers: tuple[bytes, bytes], path: bytes = b"/v1/chat/completions"
) -> Request:
    return Request(b"POST", path, list(headers), body, True, True)


def chat(model: object = "m") -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()


def error_code(refused: Refused) -> str:
    code: str = json.loads(refused.answer.body)["error"]["code"]
    return code


FLEET = fleet_of(engine("a", "m"), engine("b", "m", "m-lora"))


def test_a_request_for_a_served_model_is_admitted_to_a_candidate() -> None:
    decision = admit(request(chat()), FLEET, RoundRobin())
    assert isinstance(decision, Admitted)
    assert decision.engine.id in ("a", "b")
    assert decision.features == RequestFeatures("m", None)


def test_an_adapter_is_admitted_only_to_the_engine_serving_it() -> None:
    decision = admit(request(chat("m-lora")), FLEET, RoundRobin())
    assert isinstance(decision, Admitted) and decision.engine.id == "b"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "invalid_json"),
        (b"[1, 2]", "invalid_request"),
        (json.dumps({"messages": []}).encode(), "missing_model"),
        (chat(model=7), "missing_model"),
        (chat(model=""), "missing_model"),
    ],
)
def test_a_malformed_request_is_refused_with_400_under_the_unknown_label(
    body: bytes, code: str
) -> None:
    decision = admit(request(body), FLEET, RoundRobin(), ON_THE_LOOP)
    assert isinstance(decision, Refused)
    assert decision.answer.status == 400 and error_code(decision) == code
    assert decision.label == UNKNOWN_MODEL


def test_a_model_nobody_serves_is_404_when_the_fleet_works() -> None:
    decision = admit(request(chat("other")), FLEET, RoundRobin())
    assert isinstance(decision, Refused)
    assert decision.answer.status == 404 and error_code(decision) == "model_not_found"
    assert decision.label == UNKNOWN_MODEL


def test_an_empty_fleet_is_503_not_404() -> None:
    decision = admit(request(chat()), fleet_of(), RoundRobin())
    assert isinstance(decision, Refused)
    assert decision.answer.status == 503
    assert "the fleet is empty" in decision.answer.body.decode()


def test_a_known_model_with_no_routable_engine_is_503_naming_the_states() -> None:
    unhealthy = fleet_of(
        engine("a", "m", state=EngineState.UNHEALTHY),
        engine("b", "m", state=EngineState.UNHEALTHY),
        engine("c", "x"),
    )
    decision = admit(request(chat()), unhealthy, RoundRobin())
    assert isinstance(decision, Refused)
    assert decision.answer.status == 503 and decision.label == "m"
    assert "2 unhealthy" in decision.answer.body.decode()


def test_the_affinity_key_is_extracted_only_for_a_policy_that_asks() -> None:
    class KeyedLeastLoaded(LeastLoaded):
        key_source = staticmethod(session_key)

    with_key = admit(request(chat(), (b"x-session-id", b"s1")), FLEET, KeyedLeastLoaded())
    without = admit(request(chat(), (b"x-session-id", b"s1")), FLEET, LeastLoaded())
    assert isinstance(with_key, Admitted) and with_key.features.key == "s1"
    assert isinstance(without, Admitted) and without.features.key is None


def test_a_policy_that_picks_nothing_gets_a_503_not_a_crash() -> None:
    class Refusing:
        name = "refusing"
        key_source = None

        def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> None:
            return None

    decision = admit(request(chat()), FLEET, Refusing())
    assert isinstance(decision, Refused)
    assert decision.answer.status == 503 and decision.label == "m"


# -- the one entry's three outcomes -----------------------------------------------------------


def test_a_small_body_is_admitted_or_refused_at_once() -> None:
    admission = Admission(FLEET, RoundRobin(), SETTINGS, upstreams())
    admitted = admission.admit(request(chat()))
    refused = admission.admit(request(b"{not json"))
    assert isinstance(admitted, Admitted) and admitted.features == RequestFeatures("m", None)
    assert isinstance(refused, Refused) and error_code(refused) == "invalid_json"


async def test_a_large_body_is_a_later_that_a_worker_process_resolves() -> None:
    policy = make_policy(RoutingName.SESSION, affinity_epsilon=1.0)
    admission = Admission(FLEET, policy, ProxySettings(inline_parse_max=64), upstreams())
    content = {"role": "user", "content": "x" * 200}
    body = json.dumps({"model": "m-lora", "user": "u1", "messages": [content]}).encode()
    try:
        later = admission.admit(request(body))
        malformed = admission.admit(request(b"{" + b" " * 200))
        assert isinstance(later, Later) and isinstance(malformed, Later)
        admitted = await asyncio.wait_for(later.decision, TIMEOUT)
        refused = await asyncio.wait_for(malformed.decision, TIMEOUT)
    finally:
        await admission.close()
    assert isinstance(admitted, Admitted) and admitted.engine.id == "b"
    assert admitted.features == RequestFeatures("m-lora", "u1")
    assert isinstance(refused, Refused) and error_code(refused) == "invalid_json"
    assert refused.answer.status == 400 and refused.label == UNKNOWN_MODEL


def kv_aware(tokenizer: ChatTokenizer | None) -> Policy:
    routing = KvRouting(index=EventIndex(4), tokenizer=tokenizer)
    return make_policy(RoutingName.KV_AWARE, affinity_epsilon=0.5, kv=routing)


def test_kv_aware_with_the_router_tokenizer_is_admitted_at_once_with_the_prompt_ids() -> None:
    decision = admit(request(chat()), FLEET, kv_aware(builtin_tokenizer()))
    assert isinstance(decision, Admitted)
    assert decision.features.kv is not None and decision.features.kv.ids


async def test_kv_aware_with_no_router_tokenizer_is_a_later_that_asks_an_engine() -> None:
    asked: list[bytes] = []

    async def tokenize(conn: EngineConnection) -> None:
        while (got := await conn.read_request()) is not None:
            asked.append(got[0].split(b" ")[1])
            answer = b'{"tokens": [1, 2, 3, 4, 5]}'
            await conn.send(
                b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer)
            )

    pools = upstreams()
    async with raw_engine(tokenize) as raw:
        engines = fleet_of(engine("a", "m", url=raw.url))
        admission = Admission(engines, kv_aware(None), SETTINGS, pools)
        try:
            later = admission.admit(request(chat()))
            embedding = b'{"model": "m", "input": "hi"}'
            at_once = admission.admit(request(embedding, path=b"/v1/embeddings"))
            large = admission.admit(request(chat() + b" " * SETTINGS.inline_parse_max))
            assert isinstance(later, Later) and isinstance(large, Later)
            admitted = await asyncio.wait_for(later.decision, TIMEOUT)
            by_load = await asyncio.wait_for(large.decision, TIMEOUT)
        finally:
            pools.close()
            await admission.close()
    assert isinstance(admitted, Admitted) and admitted.engine.id == "a"
    assert admitted.features.kv is not None and admitted.features.kv.ids == [1, 2, 3, 4, 5]
    assert asked == [b"/tokenize"]  # the embedding and the large body asked nothing
    assert isinstance(at_once, Admitted) and at_once.features.kv is not None
    assert at_once.features.kv.ids is None
    assert isinstance(by_load, Admitted) and by_load.features.kv is not None
    assert by_load.features.kv.ids is None
