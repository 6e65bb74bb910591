"""Resumed answers equal uninterrupted ones, word for word, on the simulated engines.

The simulator's next token is a function of the text before it
(`headcount.sim.engine.answer_text`), so an answer the router resumed on
another engine must read exactly as the answer one engine gives unbroken:
any word lost, repeated or mangled at the seam shows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from headcount.config import ProxySettings
from headcount.fleet import Engine
from headcount.routing import RequestFeatures
from headcount.sim.cluster.polling import wait_until
from headcount.sim.engine import answer_text
from headcount.tokens import PromptKind
from tests.support.routed import CHAT, MODEL, TIMEOUT, Routed, routed, sim

COMPLETIONS = "/v1/completions"
TOKENS = 24


class BreakingFirst:
    """Routes to the first engine (the one set to break) while it is a candidate."""

    name = "breaking-first"
    key_source = None

    def __init__(self) -> None:
        self.first = ""

    def select(self, candidates: Sequence[Engine], request: RequestFeatures) -> Engine | None:
        preferred = [engine for engine in candidates if engine.id == self.first]
        return (preferred or list(candidates) or [None])[0]


async def streamed(setup: Routed, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The text of a streamed answer through the router, and its usage event."""
    async with setup.session.post(setup.url + path, json={**body, "stream": True}) as response:
        assert response.status == 200
        raw = await response.read()
    assert raw.endswith(b"data: [DONE]\n\n")
    text, usage = "", {}
    for event in raw.split(b"\n\n"):
        if not event or event == b"data: [DONE]":
            continue
        chunk = json.loads(event.removeprefix(b"data: "))
        for choice in chunk["choices"]:
            text += choice.get("delta", {}).get("content") or choice.get("text") or ""
        usage = chunk.get("usage") or usage
    return text, usage


BODIES: dict[PromptKind, tuple[str, dict[str, Any]]] = {
    "chat": (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "Tell me more"}]}),
    "completion": (COMPLETIONS, {"model": MODEL, "prompt": "Once upon a time"}),
}


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize(
    ("mode", "after"),
    [("die-mid-stream", 1), ("die-mid-stream", 17), ("truncate-mid-stream", 9)],
)
async def test_a_resumed_answer_equals_the_uninterrupted_one(
    kind: PromptKind, mode: str, after: int
) -> None:
    path, body = BODIES[kind]
    body = {**body, "max_tokens": TOKENS, "stream_options": {"include_usage": True}}
    policy = BreakingFirst()
    breaking = sim("breaking", fail_mode=mode, die_after_chunks=after, token_delay=0.001)
    async with routed(breaking, sim("steady"), policy=policy) as setup:
        policy.first = setup.engine_ids[0]
        text, usage = await streamed(setup, path, body)
        assert text == answer_text(body, kind, TOKENS)
        assert usage["completion_tokens"] == TOKENS
        assert setup.sample("headcount_stream_resumes_total", model=MODEL, outcome="resumed") == 1
        await wait_until(setup.all_released, timeout=TIMEOUT)


async def test_the_usage_of_a_resumed_chat_is_the_uninterrupted_ones() -> None:
    path, body = BODIES["chat"]
    body = {**body, "max_tokens": TOKENS, "stream_options": {"include_usage": True}}
    async with routed(sim("steady")) as setup:
        _, unbroken = await streamed(setup, path, body)
    policy = BreakingFirst()
    breaking = sim("breaking", fail_mode="die-mid-stream", die_after_chunks=7)
    async with routed(breaking, sim("steady"), policy=policy) as setup:
        policy.first = setup.engine_ids[0]
        _, resumed = await streamed(setup, path, body)
    assert resumed == unbroken


async def test_a_stalled_stream_resumes_after_the_read_timeout_and_reads_whole() -> None:
    path, body = BODIES["chat"]
    body = {**body, "max_tokens": TOKENS}
    settings = ProxySettings(connect_timeout=1.0, read_timeout=0.3)
    policy = BreakingFirst()
    stalling = sim("stalling", fail_mode="stall-mid-stream", die_after_chunks=5)
    async with routed(stalling, sim("steady"), policy=policy, settings=settings) as setup:
        policy.first = setup.engine_ids[0]
        text, _ = await streamed(setup, path, body)
        assert text == answer_text(body, "chat", TOKENS)
        await setup.engines[0].set_fail_mode("none")  # lets the stalled stream go
