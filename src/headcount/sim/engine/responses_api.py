"""vLLM's Responses API: `POST /v1/responses`, `GET /v1/responses/{id}`, its cancel.

As vLLM (`serving_responses.py`), the engine keeps every response it makes
with `store` (true by default) in its own memory, so only it can answer
`GET /v1/responses/{id}` or continue it: a request naming an unknown
`previous_response_id`, and a GET or cancel of an unknown id, get 404
`Response with id '…' not found.`. A continued response's context is the
previous one's input and output, then the new input. `background: true`
answers at once with status `queued` and generates after; cancelling it
before it completes makes it `cancelled`, cancelling any other is a 400
(`Cannot cancel a synchronous response.`). Streamed, the events are vLLM's
(`event: <type>` and `data: {"type": ..., "sequence_number": n, ...}`), from
`response.created`, which carries the id, to `response.completed`.
Generation takes the scheduler slot and `token_delay` per token as chat does.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from aiohttp import web

from headcount.sim.engine.parsing import Generation, parse_generation, parse_object
from headcount.sim.engine.state import EngineState
from headcount.sim.engine.tokens import answer, answer_json
from headcount.sim.engine.wire import JSON, RequestError, bad_request, json_bytes

__all__ = ["ResponsesApi"]

_STORE_MAX = 10_000
"""Responses kept; the oldest is forgotten first (vLLM keeps them until it restarts)."""


def _not_found(response_id: str) -> RequestError:
    return RequestError(404, f"Response with id '{response_id}' not found.", "NotFoundError")


def _messages(value: object) -> list[dict[str, Any]]:
    """The Responses `input` (a string or a list of messages) as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        messages = []
        for item in value:
            if isinstance(item, dict) and isinstance(item.get("role"), str):
                content = item.get("content")
                if isinstance(content, list):
                    content = "".join(
                        str(part.get("text", "")) for part in content if isinstance(part, dict)
                    )
                messages.append({"role": item["role"], "content": str(content or "")})
        if messages:
            return messages
    raise bad_request("`input` must be a string or a list of messages")


class ResponsesApi:
    """The Responses API handlers, over one engine's state and its stored responses."""

    def __init__(self, state: EngineState) -> None:
        self._state = state
        self._prefix = os.urandom(8).hex()
        self._count = 0
        self._stored: dict[str, dict[str, Any]] = {}
        """Each stored response, and (`_context`) the messages it answered."""
        self._context: dict[str, list[dict[str, Any]]] = {}
        self._background: dict[str, asyncio.Task[None]] = {}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/responses", self._create),
            web.get("/v1/responses/{response_id}", self._retrieve),
            web.post("/v1/responses/{response_id}/cancel", self._cancel),
        ]

    async def close(self, _app: web.Application) -> None:
        """Cancel the background responses still generating (the engine stops)."""
        tasks = list(self._background.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _retrieve(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        stored = self._stored.get(response_id)
        if stored is None:
            return _not_found(response_id).response()
        return web.Response(body=json_bytes(stored), content_type=JSON)

    async def _cancel(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        stored = self._stored.get(response_id)
        if stored is None:
            return _not_found(response_id).response()
        if stored["status"] not in ("queued", "in_progress"):
            return bad_request("Cannot cancel a synchronous response.").response()
        stored["status"] = "cancelled"
        task = self._background.pop(response_id, None)
        if task is not None:
            task.cancel()
        return web.Response(body=json_bytes(stored), content_type=JSON)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        state = self._state
        with state.in_flight_request():
            refusal = await state.failures.refusal(generation=True)
            if refusal is not None:
                return refusal
            try:
                body = parse_object(await request.read())
                messages = self._conversation(body)
                chat = {
                    "model": body.get("model", state.config.model),
                    "messages": messages,
                    "max_tokens": body.get("max_output_tokens") or 16,
                }
                generation = parse_generation(
                    json_bytes(chat),
                    "chat",
                    state.config.model,
                    state.models.served,
                    state.tokenizer,
                )
                if body.get("background") is True and body.get("store") is False:
                    raise bad_request("background responses must be stored")
            except RequestError as error:
                return error.response()
            response = self._response(body, generation)
            if body.get("store", True) is not False:
                self._keep(response, messages)
            if body.get("background") is True:
                response["status"] = "queued"
                task = asyncio.ensure_future(self._generate(generation, response, None))
                self._background[response["id"]] = task
                task.add_done_callback(lambda _: self._background.pop(response["id"], None))
                return web.Response(body=json_bytes(response), content_type=JSON)
            if body.get("stream") is True:
                return await self._stream(request, generation, response)
            await self._generate(generation, response, None)
            state.served += 1
            return web.Response(body=json_bytes(response), content_type=JSON)

    def _conversation(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The messages this response answers: the previous response's, then `input`."""
        messages: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str) or previous not in self._context:
                raise _not_found(str(previous))
            before = self._stored[previous]
            messages += self._context[previous]
            messages.append({"role": "assistant", "content": _output_text(before)})
        instructions = body.get("instructions")
        if isinstance(instructions, str) and not messages:
            messages.append({"role": "system", "content": instructions})
        return messages + _messages(body.get("input"))

    def _response(self, body: dict[str, Any], generation: Generation) -> dict[str, Any]:
        self._count += 1
        return {
            "id": f"resp_{self._prefix}{self._count:x}",
            "created_at": int(time.time()),
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": generation.model,
            "object": "response",
            "output": [],
            "parallel_tool_calls": True,
            "temperature": body.get("temperature", 1.0),
            "tool_choice": "auto",
            "tools": [],
            "top_p": body.get("top_p", 1.0),
            "background": body.get("background") is True,
            "max_output_tokens": generation.max_tokens,
            "previous_response_id": body.get("previous_response_id"),
            "status": "in_progress",
            "usage": None,
        }

    def _keep(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        while len(self._stored) >= _STORE_MAX:
            oldest = next(iter(self._stored))
            del self._stored[oldest]
            del self._context[oldest]
        self._stored[response["id"]] = response
        self._context[response["id"]] = messages

    async def _generate(
        self,
        generation: Generation,
        response: dict[str, Any],
        each_token: web.StreamResponse | None,
    ) -> None:
        """Generate into `response` (streaming each token's delta to `each_token`)."""
        state = self._state
        run = state.run(generation)
        async with state.scheduler.slot(run):
            await run.prefill()
            state.prompt_tokens += generation.prompt_tokens
            if response["status"] == "queued":
                response["status"] = "in_progress"
            tokens = answer_json(generation.context, generation.max_tokens)
            item_id = "msg_" + response["id"][len("resp_") :]
            for index, token in enumerate(tokens):
                await run.generated(index + 1)
                if state.config.token_delay:
                    await state.timebase.sleep(state.config.token_delay)
                state.generation_tokens += 1
                if each_token is not None:
                    delta = {"item_id": item_id, "output_index": 0, "content_index": 0}
                    delta["delta"] = json.loads(token)
                    await each_token.write(_event("response.output_text.delta", index + 2, delta))
        text = answer(generation.context, generation.max_tokens)
        response["output"] = [
            {
                "id": item_id,
                "content": [
                    {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
                ],
                "role": "assistant",
                "status": "completed",
                "type": "message",
            }
        ]
        response["status"] = "completed"
        response["usage"] = {
            "input_tokens": generation.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": generation.max_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": generation.prompt_tokens + generation.max_tokens,
        }

    async def _stream(
        self, request: web.Request, generation: Generation, response: dict[str, Any]
    ) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"Cache-Control": "no-cache"})
        stream.content_type = "text/event-stream"
        try:
            await stream.prepare(request)
            await stream.write(_event("response.created", 0, {"response": response}))
            await stream.write(_event("response.in_progress", 1, {"response": response}))
            await self._generate(generation, response, stream)
            done = _event("response.completed", generation.max_tokens + 2, {"response": response})
            await stream.write(done)
        except ConnectionError:
            self._state.note_disconnect()
            return stream
        self._state.served += 1
        return stream


def _event(kind: str, sequence: int, fields: dict[str, Any]) -> bytes:
    data = {"type": kind, "sequence_number": sequence, **fields}
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), json_bytes(data))


def _output_text(response: dict[str, Any]) -> str:
    return "".join(
        str(part.get("text", ""))
        for item in response.get("output", ())
        for part in item.get("content", ())
    )
