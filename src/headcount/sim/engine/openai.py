"""The OpenAI API vLLM serves: models, chat and text completions, streamed or not, and embeddings.

Generation holds a scheduler slot for its whole length, takes `token_delay`
per token and stops, freeing the slot, when the client goes away.
"""

from __future__ import annotations

import asyncio
import itertools
import os

from aiohttp import web

from headcount.sim.engine.failures import die
from headcount.sim.engine.parsing import (
    Generation,
    Kind,
    embedding_inputs,
    parse_generation,
    parse_object,
    requested_model,
)
from headcount.sim.engine.responses import (
    ChunkFrames,
    completion_body,
    embeddings_body,
    stream_head,
    usage_json,
)
from headcount.sim.engine.state import EngineState
from headcount.sim.engine.wire import JSON, REQUEST_ID, RequestError, json_bytes

__all__ = ["OpenAiApi"]


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
            refusal = await self._state.failures.refusal()
            return refusal or await self._generate(request, kind)

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        state = self._state
        try:
            raw = await request.read()
            generation = parse_generation(raw, kind, state.config.model, state.models.served)
        except RequestError as error:
            return error.response()
        async with state.scheduler:
            if generation.stream:
                return await self._stream(request, generation)
            return await self._complete(request, generation)

    async def _complete(self, request: web.Request, generation: Generation) -> web.Response:
        await self._pace(generation.max_tokens)
        response = web.Response(content_type=JSON)
        if self._state.failures.mode == "die-mid-stream":
            die(request)
            return response
        body = completion_body(generation, self._response_id(request), self._state.name)
        response.body = json_bytes(body)
        self._state.served += 1
        return response

    async def _stream(self, request: web.Request, generation: Generation) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Cache-Control": "no-cache"})
        response.content_type = "text/event-stream"
        head, frames = stream_head(generation, self._response_id(request), self._state.name)
        ending = b"data: [DONE]\n\n"
        if generation.include_usage:
            ending = head + b'"choices":[],"usage":' + usage_json(generation) + ending
        try:
            await response.prepare(request)
            if self._state.config.token_delay or self._state.failures.mode != "none":
                if not await self._stream_tokens(response, generation, frames):
                    die(request)
                    return response
                await response.write(ending)
            else:
                # Tokens that take no time are all ready at once, so they leave in one write.
                await response.write(frames.all_chunks(generation.max_tokens) + ending)
        except ConnectionError:
            self._state.note_disconnect()
            return response
        self._state.served += 1
        return response

    async def _stream_tokens(
        self, response: web.StreamResponse, generation: Generation, frames: ChunkFrames
    ) -> bool:
        """Write each token as it is generated; False when the engine must die instead."""
        failures = self._state.failures
        last = generation.max_tokens - 1
        for index in range(generation.max_tokens):
            await self._pace(1)
            if failures.dying(index):
                return False
            await response.write(frames.chunk(index, index == last))
        return not failures.dying(generation.max_tokens)

    async def _pace(self, tokens: int) -> None:
        """The time `tokens` tokens take to generate, stretched by a hang."""
        if self._state.config.token_delay:
            await asyncio.sleep(self._state.config.token_delay * tokens)
        await self._state.failures.wait_while_hung()

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        with self._state.in_flight_request():
            refusal = await self._state.failures.refusal()
            return refusal or await self._embed(request)

    async def _embed(self, request: web.Request) -> web.Response:
        state = self._state
        try:
            body = parse_object(await request.read())
            model = requested_model(body, state.config.model, state.models.served)
            inputs = embedding_inputs(body)
        except RequestError as error:
            return error.response()
        response = web.Response(content_type=JSON)
        if state.failures.mode == "die-mid-stream":
            die(request)
            return response
        answer = embeddings_body(model, inputs, self._response_id(request), state.name)
        response.body = json_bytes(answer)
        state.served += 1
        return response

    def _response_id(self, request: web.Request) -> str:
        return request.headers.get(REQUEST_ID) or f"{self._id_prefix}{next(self._ids):x}"
