"""What peer routers ask an engine besides generation: `/tokenize` (and `/detokenize`), render
and server info.

vllm-router's cache-aware policies get a request's token ids from the engine
(`POST /v1/chat/completions/render` or `/v1/completions/render`, falling back
to `POST /tokenize`), and its `kv_aware` policy reads `GET /get_server_info`
(instance, model, KV block size). sglang-router reads `GET /server_info` and
`GET /model_info` (or `/get_model_info`) at startup. Shapes are vLLM 0.33's
(and SGLang's for the info); unknown request fields are ignored.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from aiohttp import web

from headcount.sim.engine.parsing import parse_object, requested_model
from headcount.sim.engine.prompts import chat_prompt_ids, completion_prompt_ids, tokenize
from headcount.sim.engine.state import EngineState
from headcount.sim.engine.wire import JSON, RequestError, bad_request, json_bytes

__all__ = ["TokenizeApi"]


class TokenizeApi:
    """The handlers of `/tokenize`, the render routes and the info routes."""

    def __init__(self, state: EngineState) -> None:
        self._state = state
        self._ids = itertools.count(1)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/tokenize", self._tokenize),
            web.post("/detokenize", self._detokenize),
            web.post("/v1/chat/completions/render", self._render_chat),
            web.post("/v1/completions/render", self._render_completion),
            web.get("/get_server_info", self._server_info),
            web.get("/server_info", self._server_info),
            web.get("/get_model_info", self._model_info),
            web.get("/model_info", self._model_info),
        ]

    async def _tokenize(self, request: web.Request) -> web.Response:
        def answer(body: dict[str, Any], model: str) -> object:
            state = self._state
            ids, strings = tokenize(body, state.tokenizer, strings=_strings(body))
            return {
                "count": len(ids),
                "max_model_len": state.config.max_model_len,
                "tokens": ids,
                "token_strs": strings,
            }

        return await self._answer(request, answer)

    async def _detokenize(self, request: web.Request) -> web.Response:
        """vLLM's `/detokenize` shape; the sim's vocabulary has no decoder, so each id is
        written as `<id>`."""

        def answer(body: dict[str, Any], model: str) -> object:
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise bad_request("`tokens` must be a list of token ids")
            return {"prompt": "".join(f"<{token}>" for token in tokens)}

        return await self._answer(request, answer)

    async def _render_chat(self, request: web.Request) -> web.Response:
        return await self._answer(request, lambda body, model: self._render(body, model, True))

    async def _render_completion(self, request: web.Request) -> web.Response:
        return await self._answer(request, lambda body, model: [self._render(body, model, False)])

    def _render(self, body: dict[str, Any], model: str, chat: bool) -> dict[str, object]:
        """vLLM's render: the `GenerateRequest` the engine would run."""
        ids = (chat_prompt_ids if chat else completion_prompt_ids)(body, self._state.tokenizer)
        return {
            "request_id": f"render-{next(self._ids)}",
            "token_ids": ids,
            "sampling_params": {
                "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens")
            },
            "model": model,
            "features": None,
        }

    async def _answer(
        self, request: web.Request, answer: Callable[[dict[str, Any], str], object]
    ) -> web.Response:
        """Through the failure gate, parse the body, check its model, answer it as JSON."""
        state = self._state
        refusal = await state.failures.refusal()
        if refusal is not None:
            return refusal
        try:
            body = parse_object(await request.read())
            model = requested_model(body, state.config.model, state.models.served)
            result = answer(body, model)
        except RequestError as error:
            return error.response()
        return web.Response(body=json_bytes(result), content_type=JSON)

    async def _server_info(self, request: web.Request) -> web.Response:
        state = self._state
        await state.failures.wait_while_hung()
        info = {
            "instance_id": state.name,
            "model_id": state.config.model,
            "model_path": state.config.model,
            "tokenizer_path": state.tokenizer.name,
            "kv_block_size": state.config.block_size,
            "max_model_len": state.config.max_model_len,
            "is_generation": True,
        }
        return web.Response(body=json_bytes(info), content_type=JSON)

    async def _model_info(self, request: web.Request) -> web.Response:
        state = self._state
        await state.failures.wait_while_hung()
        info = {
            "model_path": state.config.model,
            "tokenizer_path": state.tokenizer.name,
            "is_generation": True,
        }
        return web.Response(body=json_bytes(info), content_type=JSON)


def _strings(body: dict[str, object]) -> bool:
    return body.get("return_token_strs") is True
