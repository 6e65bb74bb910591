"""Measure the router's CPU for a kv-aware decision: tokenizing, block keys and index matching.

The budget (issue 10): at most 300 µs per 1,000 prompt tokens, for 3,000-token
prompts whose system prompt repeats. Each request here is a chat: one of a few
tenants' system prompts (about 2,500 tokens, so after its first use it comes
from the tokenizer's segment cache) and a fresh user message (about 500 tokens,
never seen before, encoded in full). A decision is `tokens.prompt_ids` then
`KvAware.select` over `--engines` candidates whose index (`kvindex`'s
`EngineIndex`) holds the tenant's prefix on one of them: keys computed once
per block size, one lookup per block per engine until the first miss.

With `--placement` the policy also counts each request's prefix group and
keeps it to the homes of a placement plan (`--kv-placement on`), built once
over the warm-up's traffic; the plan's own re-build (every 2 s, off the
request path) is timed apart.

Usage: `.venv/bin/python -m bench.micro.kv_route_cost [--tokenizer DIR|builtin]
[--requests N] [--repeats R] [--engines E] [--placement]`. Prints the median over
repeats of the mean µs per request, and per 1,000 prompt tokens, for each phase
and in all.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from headcount.fleet import Engine, EngineLoad, EngineSpec, EngineState
from headcount.kvevents import BlockStored
from headcount.kvindex.index import EngineIndex
from headcount.kvindex.keys import BlockKey
from headcount.routing import RequestFeatures
from headcount.routing.kv import KvAware, KvRouting
from headcount.routing.kv.placement import PlacementSettings
from headcount.routing.kv.planning import Placement
from headcount.tokens import ChatTokenizer, builtin_tokenizer, load_tokenizer, prompt_ids

MODEL = "sim-model"
BLOCK_SIZE = 16


class Indexes:
    """One real `EngineIndex` per engine, fed one stored event per tenant: `KvIndexes`'
    `match` without the registry around it."""

    def __init__(self) -> None:
        self.by_engine: dict[str, EngineIndex] = {}

    def store(self, engine_id: str, ids: Sequence[int]) -> None:
        blocks = len(ids) // BLOCK_SIZE
        event = BlockStored(
            [hash((engine_id, n, tuple(ids[:BLOCK_SIZE]))) for n in range(blocks)],
            None,
            list(ids[: blocks * BLOCK_SIZE]),
            BLOCK_SIZE,
        )
        self.by_engine.setdefault(engine_id, EngineIndex()).apply(event)

    def match(self, engine_id: str, keys: Sequence[BlockKey]) -> int | None:
        index = self.by_engine.get(engine_id)
        return 0 if index is None else index.match(keys)

    def block_size(self, engine_id: str) -> int | None:
        return BLOCK_SIZE

    def routed(self, engine_id: str, prompt_tokens: int, predicted_cached_tokens: int) -> None:
        pass

    def prefilled(self, engine_id: str, predicted_cached_tokens: int) -> None:
        pass


def words(rng: random.Random, count: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choices(letters, k=rng.randint(2, 8))) for _ in range(count))


def text_of(rng: random.Random, tokenizer: ChatTokenizer, tokens: int, step: int) -> str:
    """Random words, `step` at a time, until they encode to at least `tokens` tokens."""
    text = ""
    while len(tokenizer.encode(text, add_special_tokens=False)) < tokens:
        text += words(rng, step) + "\n"
    return text


def bodies(
    rng: random.Random, tokenizer: ChatTokenizer, count: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """`count` chats over 4 tenants' system prompts, each about 3,000 tokens in all."""
    systems = [text_of(rng, tokenizer, 2500, 100) for _ in range(4)]
    chats = []
    for _ in range(count):
        messages = [
            {"role": "system", "content": rng.choice(systems)},
            {"role": "user", "content": text_of(rng, tokenizer, 500, 20)},
        ]
        chats.append({"model": MODEL, "messages": messages})
    return chats, systems


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro.kv_route_cost", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument("--tokenizer", default="builtin", help="a tokenizer directory, or builtin")
    parser.add_argument("--requests", type=int, default=200, help="requests per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--placement", action="store_true", help="with a placement plan")
    args = parser.parse_args()
    tokenizer = (
        builtin_tokenizer() if args.tokenizer == "builtin" else load_tokenizer(args.tokenizer)
    )
    rng = random.Random(10)
    index = Indexes()
    engines = [
        Engine(
            EngineSpec(id=f"e{n}", name=f"e{n}", url=f"http://e{n}", source="static"),
            EngineLoad(kv_capacity_blocks=28_000, kv_block_size=BLOCK_SIZE),
            EngineState.READY,
            ({"id": MODEL},),
        )
        for n in range(args.engines)
    ]
    placement = Placement(PlacementSettings()) if args.placement else None
    routing = KvRouting(index=index, tokenizer=tokenizer, placement=placement)
    policy = KvAware(routing, epsilon=0.5)
    chats, systems = bodies(rng, tokenizer, args.requests * (args.repeats + 1))
    for number, system in enumerate(systems):  # each tenant's prefix held by one engine
        ids = prompt_ids({"messages": [{"role": "system", "content": system}]}, "chat", tokenizer)
        index.store(engines[number % len(engines)].id, ids)
    for body in chats[: args.requests]:  # warm the segment cache with the system prompts
        ids = prompt_ids(body, "chat", tokenizer)
        policy.select(engines, RequestFeatures(MODEL, None, policy.request(MODEL, ids)))
    if placement is not None:
        started = time.perf_counter()
        placement.rebuild(engines, lambda _: True)
        took = (time.perf_counter() - started) * 1e3
        plan = placement.current()
        homed = 0 if plan is None else len(plan.homes)
        print(f"plan: {took:.2f} ms to build, {len(placement.traffic)} groups, {homed} homed")
    tokenize_us: list[float] = []
    route_us: list[float] = []
    tokens: list[float] = []
    for repeat in range(1, args.repeats + 1):
        batch = chats[repeat * args.requests : (repeat + 1) * args.requests]
        tokenize = route = 0.0
        count = 0
        for body in batch:
            started = time.perf_counter()
            ids = prompt_ids(body, "chat", tokenizer)
            tokenized = time.perf_counter()
            policy.select(engines, RequestFeatures(MODEL, None, policy.request(MODEL, ids)))
            tokenize += tokenized - started
            route += time.perf_counter() - tokenized
            count += len(ids)
        tokenize_us.append(tokenize / len(batch) * 1e6)
        route_us.append(route / len(batch) * 1e6)
        tokens.append(count / len(batch))
    prompt = statistics.median(tokens)
    total = [a + b for a, b in zip(tokenize_us, route_us, strict=True)]
    print(f"tokenizer {tokenizer.name}, {args.engines} engines, block size {BLOCK_SIZE}")
    print(f"prompt tokens per request (median): {prompt:.0f}")
    for name, values in (("tokenize", tokenize_us), ("keys+match", route_us), ("total", total)):
        median = statistics.median(values)
        print(f"{name:>10}: {median:8.1f} us/request  {median / prompt * 1000:7.1f} us/1k tokens")


if __name__ == "__main__":
    main()
