"""The OpenAI API vLLM serves: models, chat and text completions, streamed or not, and embeddings.

Generation holds a scheduler slot for its whole length (and, with a prefix
cache, its KV blocks, after waiting for its prompt's prefill; a token's block
is taken before its time, and may preempt: `run`), takes `token_delay` per
token and stops, freeing the slot, when the client goes away.
Tokens are counted (`vllm:generation_tokens_total`) as they are generated, in
steps of at most `_STEP` seconds when an answer goes out all at once, as
vLLM's engine loop counts them whatever the answer waits for.
"""

from __future__ import annotations

import itertools
import os

from aiohttp import web

from headcount.sim.engine.failures import break_answer, break_stream
from headcount.sim.engine.parsing import (
    Kind,
    embedding_inputs,
    parse_generation,
    parse_object,
    requested_model,
)
from headcount.sim.engine.prompts import completion_prompt_ids
from headcount.sim.engine.responses import (
    ChunkFrames,
    completion_body,
    embeddings_body,
    stream_head,
    usage_json,
)
from headcount.sim.engine.run import Run
from headcount.sim.engine.state import EngineState
from headcount.sim.engine.wire import JSON, REQUEST_ID, RequestError, json_bytes

__all__ = ["OpenAiApi"]

_STEP = 0.1
"""Longest wait between two counts of an answer's tokens, in seconds."""


class OpenAiApi:
    """The handlers under `/v1/`, over one engine's state."""

    def __init__(self, state: EngineState) -> None:
        self._state = state
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self._models),
            web.post("/v1/chat/completions", self._chat),
            web.post("/v1/completions", self._completion),
            web.post("/v1/embeddings", self._embeddings),
        ]

    async def _models(self, request: web.Request) -> web.Response:
        refusal = await self._state.failures.refusal()
        return refusal or web.Response(body=self._state.models.body, content_type=JSON)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, "completion")

    async def _generation(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        with self._state.in_flight_request():
            refusal = await self._state.failures.refusal(generation=True)
            return refusal or await self._generate(request, kind)

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        state = self._state
        try:
            raw = await request.read()
            served = state.models.served
            generation = parse_generation(raw, kind, state.config.model, served, state.tokenizer)
            run = state.run(generation)
        except RequestError as error:
            return error.response()
        async with state.scheduler.slot(run):
            await run.prefill()
            state.prompt_tokens += generation.prompt_tokens
            if generation.stream:
                return await self._stream(request, run)
            return await self._complete(request, run)

    async def _complete(self, request: web.Request, run: Run) -> web.StreamResponse:
        done = 0
        for tokens in run.checkpoints():
            await run.generated(tokens)  # their blocks first, as vLLM schedules a step
            await self._pace(tokens - done)
            done = tokens
        response_id = self._response_id(request)
        body = completion_body(run.generation, response_id, self._state.name, run.cached_tokens)
        return await self._answer(request, json_bytes(body))

    async def _answer(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """A whole answer, sent, or broken by a mid-stream fail mode."""
        broken = self._state.failures.whole_answer_break()
        if broken is not None:
            return await break_answer(request, broken, body)
        self._state.served += 1
        return web.Response(body=body, content_type=JSON)

    async def _stream(self, request: web.Request, run: Run) -> web.StreamResponse:
        generation = run.generation
        response = web.StreamResponse(headers={"Cache-Control": "no-cache"})
        response.content_type = "text/event-stream"
        head, frames = stream_head(generation, self._response_id(request), self._state.name)
        ending = b"data: [DONE]\n\n"
        if generation.include_usage:
            usage = usage_json(generation, run.cached_tokens)
            ending = head + b'"choices":[],"usage":' + usage + ending
        try:
            await response.prepare(request)
            if self._state.config.token_delay or self._state.failures.mode != "none":
                if not await self._stream_tokens(request, response, run, frames, ending):
                    return response
            else:
                # Tokens that take no time are all ready at once, so they leave in one write.
                await run.generated(generation.max_tokens)
                self._state.generation_tokens += generation.max_tokens
                await response.write(frames.all_chunks(generation.max_tokens) + ending)
        except ConnectionError:
            self._state.note_disconnect()
            return response
        self._state.served += 1
        return response

    async def _stream_tokens(
        self,
        request: web.Request,
        response: web.StreamResponse,
        run: Run,
        frames: ChunkFrames,
        ending: bytes,
    ) -> bool:
        """Write each token as it is generated, then `ending`; False when a mid-stream fail
        mode broke the stream instead."""
        failures = self._state.failures
        tokens = run.generation.max_tokens
        for index in range(tokens + 1):
            chunk = ending
            if index < tokens:
                await run.generated(index + 1)
                await self._pace(1)
                chunk = frames.chunk(index, index == tokens - 1)
            broken = await failures.mid_stream(index)
            if broken is not None:
                await break_stream(request, response, broken, chunk)
                return False
            await response.write(chunk)
        return True

    async def _pace(self, tokens: int) -> None:
        """The time `tokens` tokens take to generate, stretched by a hang or a stall, counting
        them as they come: a step of at most `_STEP` at a time, none while stalled."""
        state = self._state
        delay = state.config.token_delay
        per_step = max(1, int(_STEP / delay)) if delay else tokens
        left = tokens  # at least 1: max_tokens is
        while left:
            step = min(left, per_step)
            if delay:
                await state.timebase.sleep(delay * step)
            await state.failures.wait_while_stalled()
            state.generation_tokens += step
            left -= step

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        with self._state.in_flight_request():
            refusal = await self._state.failures.refusal(generation=True)
            return refusal or await self._embed(request)

    async def _embed(self, request: web.Request) -> web.StreamResponse:
        state = self._state
        try:
            body = parse_object(await request.read())
            model = requested_model(body, state.config.model, state.models.served)
            inputs = embedding_inputs(body)
            tokens = sum(
                len(completion_prompt_ids({"prompt": item}, state.tokenizer)) for item in inputs
            )
        except RequestError as error:
            return error.response()
        answer = embeddings_body(model, inputs, self._response_id(request), state.name, tokens)
        return await self._answer(request, json_bytes(answer))

    def _response_id(self, request: web.Request) -> str:
        return request.headers.get(REQUEST_ID) or f"{self._id_prefix}{next(self._ids):x}"
