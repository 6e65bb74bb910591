"""The routing benchmark's traffic, seeded, so every target gets exactly the same requests.

Shaped like llm-d's multi-tenant prefix-cache test:

- `tenants` tenants, each with its own long system prompt (`system_words`
  random words, about one token each under the simulator's built-in
  tokenizer) that every one of its requests starts with.
- Each request picks a tenant uniformly and asks a short unique question
  (`question_words` words, numbered so no two are equal).
- A share `chat_share` of the requests continue a multi-turn chat instead:
  one of the tenant's open conversations gets the previous question, a
  synthetic answer (`answer_words` words; the workload's own text, not the
  engine's output, so the history is known before the run) and the new
  question appended, so its prompt grows by a turn and its previous prompt is
  its prefix. A chat closes after `max_turns` turns.
- Arrivals are Poisson: exponential gaps at `rate` requests per second (open
  loop, scheduled in advance whatever the answers do).

Everything comes from one `random.Random(seed)`: the same seed, rate and
duration give the same requests at the same offsets.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

__all__ = ["Arrival", "WorkloadShape", "arrivals", "tenant_prompts"]

_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "kernel",
    "router",
    "engine",
    "cache",
    "block",
    "token",
    "prefix",
    "tenant",
    "policy",
    "queue",
    "batch",
    "stream",
    "model",
    "weight",
    "layer",
    "tensor",
    "shard",
    "replica",
    "region",
    "zone",
    "latency",
    "budget",
    "contract",
    "invoice",
    "ledger",
    "account",
    "payment",
    "refund",
    "order",
    "parcel",
    "sensor",
    "signal",
    "vector",
    "matrix",
    "graph",
    "node",
    "edge",
    "path",
    "cluster",
    "service",
    "request",
    "reply",
]


@dataclass(frozen=True)
class WorkloadShape:
    """How the traffic looks; the defaults are what `make bench-routing` measures."""

    tenants: int = 16
    system_words: int = 2000
    question_words: int = 12
    answer_words: int = 40
    chat_share: float = 0.3
    max_turns: int = 6
    open_chats_per_tenant: int = 2
    max_tokens: int = 24
    seed: int = 9


@dataclass(frozen=True)
class Arrival:
    """One request: when it is due (seconds after the start), its tenant, and its body."""

    at_s: float
    tenant: int
    turn: int
    """1 for a fresh question, n for the n-th turn of a chat."""
    body: bytes = field(repr=False)


def tenant_prompts(shape: WorkloadShape) -> list[str]:
    """Each tenant's system prompt; seeded apart from the arrivals so every rate shares them."""
    rng = random.Random(f"{shape.seed}-system")
    return [
        f"You are the assistant of tenant {tenant}. "
        + " ".join(rng.choice(_WORDS) for _ in range(shape.system_words))
        for tenant in range(shape.tenants)
    ]


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def arrivals(shape: WorkloadShape, model: str, rate: float, duration_s: float) -> list[Arrival]:
    """The requests of one run at `rate` per second for `duration_s` seconds, in send order."""
    rng = random.Random(f"{shape.seed}-{rate}-{duration_s}")
    systems = tenant_prompts(shape)
    chats: dict[int, list[list[dict[str, str]]]] = {t: [] for t in range(shape.tenants)}
    out: list[Arrival] = []
    at = rng.expovariate(rate)
    number = 0
    while at < duration_s:
        number += 1
        tenant = rng.randrange(shape.tenants)
        question = f"Question {number}: {_words(rng, shape.question_words)}?"
        open_chats = chats[tenant]
        if open_chats and rng.random() < shape.chat_share:
            history = open_chats[rng.randrange(len(open_chats))]
            history.append({"role": "assistant", "content": _words(rng, shape.answer_words)})
            history.append({"role": "user", "content": question})
            messages = [dict(message) for message in history]
            if len(history) // 2 >= shape.max_turns:
                open_chats.remove(history)
        else:
            messages = [
                {"role": "system", "content": systems[tenant]},
                {"role": "user", "content": question},
            ]
            if len(open_chats) < shape.open_chats_per_tenant:
                open_chats.append([dict(message) for message in messages])
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": shape.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        turn = sum(1 for message in messages if message["role"] == "user")
        out.append(Arrival(at, tenant, turn, json.dumps(body).encode()))
        at += rng.expovariate(rate)
    return out
