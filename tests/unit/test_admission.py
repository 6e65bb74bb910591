"""Admission through its one entry, decided on the spot: an engine (`Admitted`) or an answer.

A large body, or a `kv-aware` request with no router tokenizer, is a `Later`
instead: those are tests/process/test_admission.py, since a worker process or
an engine answers them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from headcount._http.handler import Request
from headcount.config import ProxySettings, RoutingName
from headcount.fleet import Engine, EngineState
from headcount.proxy.admission import Admission, Admitted, Refused
from headcount.routing import (
    LeastLoaded,
    RequestFeatures,
    RoundRobin,
    make_policy,
    session_key,
)
from headcount.surfaces.metrics import UNKNOWN_MODEL
from headcount.tokens import ChatTokenizer, builtin_tokenizer
from headcount.tokens.builtin import CHATML_TEMPLATE, BuiltinVocabulary
from tests.support import engine
from tests.support.admission import (
    SETTINGS,
    admit,
    chat,
    error_code,
    fleet_of,
    kv_aware,
    request,
    upstreams,
)

ON_THE_LOOP = ProxySettings(inline_parse_max=1024 * 1024)
"""Every body here read on the loop, the 100k-deep one too."""


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


LONE = b'{"role": "user", "content": "a \\ud800 b"}'
"""A lone UTF-16 surrogate: valid JSON, yet no Unicode text the router or an engine can encode."""


@pytest.mark.parametrize("policy", ["round-robin", "session", "kv-aware"])
@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "messages": [' + LONE + b"]}",
        b'{"model": "other", "messages": [' + LONE + b"]}",
        b'{"model": "m", "user": "\\udc00", "messages": []}',
        b'{"model": "m", "messages": [], "x": ["\\uDBFF"]}',
    ],
)
def test_a_lone_surrogate_is_refused_with_400_whatever_the_policy(policy: str, body: bytes) -> None:
    policies = {
        "round-robin": RoundRobin(),
        "session": make_policy(RoutingName.SESSION, affinity_epsilon=0.5),
        "kv-aware": kv_aware(builtin_tokenizer()),
    }
    decision = admit(request(body, (b"x-session-id", b"s1")), FLEET, policies[policy])
    assert isinstance(decision, Refused)
    assert decision.answer.status == 400 and error_code(decision) == "invalid_unicode"
    error = json.loads(decision.answer.body)["error"]
    assert error["type"] == "invalid_request_error" and "surrogate" in error["message"]
    assert decision.label == UNKNOWN_MODEL


def test_a_surrogate_pair_and_an_escaped_backslash_are_text() -> None:
    pair = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude00 \\\\ud800"}]}'
    assert json.loads(pair)["messages"][0]["content"] == "\U0001f600 \\ud800"
    for policy in (RoundRobin(), kv_aware(builtin_tokenizer())):
        assert isinstance(admit(request(pair), FLEET, policy), Admitted)


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


def test_an_empty_fleet_is_503_saying_why_as_health_judged_it() -> None:
    fleet = fleet_of()
    fleet.unroutable_reason = "first sync not done: API server unreachable"
    decision = admit(request(chat("m")), fleet, RoundRobin())
    assert isinstance(decision, Refused)
    assert json.loads(decision.answer.body)["error"]["message"] == (
        "no engine available for model `m`: first sync not done: API server unreachable"
    )
    assert (decision.label, decision.model) == (UNKNOWN_MODEL, "m")


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


def test_kv_aware_with_the_router_tokenizer_is_admitted_at_once_with_the_prompt_ids() -> None:
    decision = admit(request(chat()), FLEET, kv_aware(builtin_tokenizer()))
    assert isinstance(decision, Admitted)
    assert decision.features.kv is not None and decision.features.kv.ids


class CountingVocabulary(BuiltinVocabulary):
    """The built-in vocabulary, counting the texts it encodes."""

    encoded = 0

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        self.encoded += 1
        return super().encode(text, add_special_tokens)


def test_kv_aware_refuses_a_model_nobody_serves_before_any_tokenizing() -> None:
    vocabulary = CountingVocabulary()
    tokenizer = ChatTokenizer(vocabulary, {"default": CHATML_TEMPLATE}, {}, name="counted")
    vocabulary.encoded = 0
    for policy in (kv_aware(tokenizer), kv_aware(None)):
        decision = admit(request(chat("other")), FLEET, policy)
        assert vocabulary.encoded == 0
        assert isinstance(decision, Refused), decision  # no engine's /tokenize awaited either
        assert decision.answer.status == 404 and error_code(decision) == "model_not_found"


def within(body: bytes, *endpoints: str) -> Request:
    asked = request(body)
    asked.subset = frozenset(endpoints)
    return asked


def test_a_subset_hint_restricts_the_candidates_the_policy_sees() -> None:
    fleet = fleet_of(
        *(engine(name, "m", url=f"http://10.0.0.{n}:8000") for n, name in enumerate("abc", 1))
    )
    for _ in range(6):
        decision = admit(within(chat(), "10.0.0.2:8000"), fleet, RoundRobin())
        assert isinstance(decision, Admitted)
        assert decision.engine.spec.name == "b"


@pytest.mark.parametrize("endpoints", [(), ("10.0.0.9:8000",)])
def test_a_subset_hint_with_no_candidate_in_it_is_503(endpoints: tuple[str, ...]) -> None:
    fleet = fleet_of(engine("a", "m", url="http://10.0.0.1:8000"))
    decision = admit(within(chat(), *endpoints), fleet, RoundRobin())
    assert isinstance(decision, Refused)
    assert decision.answer.status == 503 and decision.label == "m"
    assert error_code(decision) == "no_engine_available"
