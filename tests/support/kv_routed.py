"""The proxy on 127.0.0.1 routing `kv-aware`, before simulated engines that share a prefix.

Requests share a long system prompt (`ask`); `kv_policy` is the `kv-aware`
policy over an `EventIndex`, and `record` wires each engine's KV events to it,
so the router predicts from what the engines really cached.
"""

from __future__ import annotations

from typing import Any

from headcount.config import RoutingName
from headcount.routing import Policy, make_policy
from headcount.routing.kv import KvRouting
from headcount.tokens import ChatTokenizer
from tests.support.kv_event_index import EventIndex
from tests.support.routed import MODEL, Routed, sim

__all__ = ["BS", "ENGINES", "QUESTIONS", "SYSTEM", "ask", "kv_policy", "record"]

BS = 4
SYSTEM = {"role": "system", "content": "You answer for tenant seven. " + "Be exact. " * 60}


def ask(question: str) -> dict[str, Any]:
    messages = [SYSTEM, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "max_tokens": 2}


def kv_policy(index: EventIndex, tokenizer: ChatTokenizer | None = None, **options: Any) -> Policy:
    routing = KvRouting(index=index, tokenizer=tokenizer, **options)
    return make_policy(RoutingName.KV_AWARE, affinity_epsilon=0.5, kv=routing)


def record(setup: Routed, index: EventIndex) -> None:
    for engine, engine_id in zip(setup.engines, setup.engine_ids, strict=False):
        engine.set_kv_sink(index.recorder(engine_id))


ENGINES = [sim(name, kv_blocks=600, block_size=BS) for name in ("a", "b", "c")]
QUESTIONS = [f"question number {n}?" for n in range(6)]
