"""The routing benchmark's traffic, seeded, so every target gets exactly the same requests.

Shaped like llm-d's multi-tenant prefix-cache test:

- `tenants` tenants, each with its own long system prompt (`system_words`
  random words, about one token each under the simulator's built-in
  tokenizer) that every one of its requests starts with.
- Each request picks a tenant and asks a short unique question
  (`question_words` words, numbered so no two are equal): uniformly when
  `zipf` is 0, else tenant t (0-based) with weight 1/(t+1)^zipf, so tenant 0
  is the hottest.
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

`WORKLOADS` names the shapes the benchmark measures, each with its default
request rates (fleet: bench/routing/fleet.py, 4 engines x 720 blocks x 16
tokens = 46,080 tokens of cache):

- `fitting`: 30 tenants, Zipf 1.2, 1,400-word system prompts (~1,416 tokens
  each, 42,480 in all: the whole set fits the fleet's cache);
- `pressure`: 60 tenants, Zipf 1.2, system prompts of `PRESSURE_WORDS` words
  (1,904: ~1,920 tokens each, so the 60 of them are 2.5x the fleet's cache);
- `uniform`: the suite's original shape, 16 tenants drawn uniformly, ~2,000-token
  prompts (a quarter of them per engine's cache).
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, field

from bench.routing.fleet import BLOCK_SIZE, ENGINES, KV_BLOCKS

__all__ = [
    "DEFAULT_WORKLOADS",
    "PRESSURE_WORDS",
    "WORKLOADS",
    "Arrival",
    "Workload",
    "WorkloadShape",
    "arrivals",
    "tenant_prompts",
    "tenant_weights",
]

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
    zipf: float = 0.0
    """Popularity skew: 0 draws tenants uniformly, else tenant t with weight 1/(t+1)^zipf."""

    def describe(self) -> str:
        popularity = f"Zipf {self.zipf:g}" if self.zipf else "uniform"
        return (
            f"{self.tenants} tenants ({popularity}), {self.system_words:,}-word system prompts, "
            f"{self.question_words}-word questions, {100 * self.chat_share:g} % chat turns "
            f"(up to {self.max_turns}, {self.answer_words}-word answers), "
            f"{self.max_tokens} output tokens"
        )


@dataclass(frozen=True)
class Workload:
    """A named shape and the request rates it is measured at by default."""

    name: str
    shape: WorkloadShape
    rates: tuple[float, ...]


_PROMPT_OVERHEAD_TOKENS = 16
"""Tokens of a system prompt beside its words under the simulator's tokenizer: the chat
template's and the "You are the assistant of tenant N." opening."""
PRESSURE_WORDS = round(2.5 * ENGINES * KV_BLOCKS * BLOCK_SIZE / 60) - _PROMPT_OVERHEAD_TOKENS
"""60 system prompts of this many words are 2.5x the fleet's cache: 1,904."""

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("fitting", WorkloadShape(tenants=30, system_words=1400, zipf=1.2), (16.0,)),
        Workload(
            "pressure", WorkloadShape(tenants=60, system_words=PRESSURE_WORDS, zipf=1.2), (16.0,)
        ),
        Workload("uniform", WorkloadShape(), (3.0, 7.0, 11.0)),
    )
}
DEFAULT_WORKLOADS = ("fitting", "pressure")
"""`uniform` is left out of the default run: it is the old shape (results in RESULTS.md), and
its three loads, the low ones' windows long when counted in requests, would make the run about
5 times longer."""


@dataclass(frozen=True)
class Arrival:
    """One request: when it is due (seconds after the start), its tenant, and its body."""

    at_s: float
    tenant: int
    turn: int
    """1 for a fresh question, n for the n-th turn of a chat."""
    number: int
    """Its question's number ("Question N" in its last message), unique in its run."""
    conversation: int
    """The number of the question that opened its chat (its own for a fresh question)."""
    body: bytes = field(repr=False)


def tenant_prompts(shape: WorkloadShape) -> list[str]:
    """Each tenant's system prompt; seeded apart from the arrivals so every rate shares them."""
    rng = random.Random(f"{shape.seed}-system")
    return [
        f"You are the assistant of tenant {tenant}. "
        + " ".join(rng.choice(_WORDS) for _ in range(shape.system_words))
        for tenant in range(shape.tenants)
    ]


def tenant_weights(shape: WorkloadShape) -> list[float]:
    """Each tenant's probability of being drawn."""
    raw = [1.0 / (tenant + 1) ** shape.zipf for tenant in range(shape.tenants)]
    return [weight / sum(raw) for weight in raw]


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def arrivals(shape: WorkloadShape, model: str, rate: float, duration_s: float) -> list[Arrival]:
    """The requests of one run at `rate` per second for `duration_s` seconds, in send order."""
    rng = random.Random(f"{shape.seed}-{rate}-{duration_s}")
    systems = tenant_prompts(shape)
    chats: dict[int, list[tuple[int, list[dict[str, str]]]]] = {t: [] for t in range(shape.tenants)}
    population = range(shape.tenants)
    cumulative = list(itertools.accumulate(tenant_weights(shape)))
    out: list[Arrival] = []
    at = rng.expovariate(rate)
    number = 0
    while at < duration_s:
        number += 1
        if shape.zipf:
            tenant = rng.choices(population, cum_weights=cumulative)[0]
        else:
            tenant = rng.randrange(shape.tenants)
        question = f"Question {number}: {_words(rng, shape.question_words)}?"
        open_chats = chats[tenant]
        if open_chats and rng.random() < shape.chat_share:
            chat = open_chats[rng.randrange(len(open_chats))]
            conversation, history = chat
            history.append({"role": "assistant", "content": _words(rng, shape.answer_words)})
            history.append({"role": "user", "content": question})
            messages = [dict(message) for message in history]
            if len(history) // 2 >= shape.max_turns:
                open_chats.remove(chat)
        else:
            messages = [
                {"role": "system", "content": systems[tenant]},
                {"role": "user", "content": question},
            ]
            conversation = number
            if len(open_chats) < shape.open_chats_per_tenant:
                open_chats.append((number, [dict(message) for message in messages]))
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": shape.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        turn = sum(1 for message in messages if message["role"] == "user")
        out.append(Arrival(at, tenant, turn, number, conversation, json.dumps(body).encode()))
        at += rng.expovariate(rate)
    return out
