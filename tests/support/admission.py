"""Admission as tests drive it: a fleet whose probes set each engine's state, requests, answers."""

from __future__ import annotations

import json
from typing import Any

from headcount._http.handler import Request
from headcount._http.pool import PoolOptions, Upstreams
from headcount._http.resolve import Resolver
from headcount.config import ProxySettings, RoutingName
from headcount.fleet import Engine, EngineState, Fleet, ProbeResult
from headcount.proxy.admission import Admission, Admitted, Later, Refused
from headcount.routing import Policy, make_policy
from headcount.routing.kv import KvRouting
from headcount.tokens import ChatTokenizer
from tests.support.kv_event_index import EventIndex

__all__ = [
    "SETTINGS",
    "admit",
    "chat",
    "error_code",
    "fleet_of",
    "kv_aware",
    "request",
    "upstreams",
]

SETTINGS = ProxySettings()


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


def kv_aware(tokenizer: ChatTokenizer | None, **options: Any) -> Policy:
    """The `kv-aware` policy over an empty index; `options`: `KvRouting`'s."""
    routing = KvRouting(index=EventIndex(4), tokenizer=tokenizer, **options)
    return make_policy(RoutingName.KV_AWARE, affinity_epsilon=0.5, kv=routing)
