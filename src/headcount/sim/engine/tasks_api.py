"""vLLM's task endpoints beside generation: rerank, score, classify, pooling, audio.

RAG stacks call `/rerank` (and `/v1/rerank`, `/v2/rerank`) and `/score`
(`/v1/score`); classifiers `/classify`; embedding pipelines `/pooling`;
speech front ends `/v1/audio/transcriptions` and `/translations`, whose body is
a `multipart/form-data` upload (the `model` a form field, `file` the audio).
The answers have vLLM's shapes with deterministic numbers (a score is a hash of
its texts): what a router must route and relay, not what a model would say.
Every answer is through the failure gate and counted in flight, as generation.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from headcount.sim.engine.parsing import parse_object, requested_model
from headcount.sim.engine.state import EngineState
from headcount.sim.engine.wire import JSON, RequestError, bad_request, json_bytes

__all__ = ["TasksApi"]

_LABELS = ("negative", "positive")
_POOLED_DIMENSIONS = 8


def _unit(*texts: object) -> float:
    """A number in [0, 1) that depends only on `texts`."""
    digest = hashlib.blake2b(json_bytes(texts), digest_size=8).digest()
    return round(int.from_bytes(digest, "big") / 2**64, 6)


def _tokens(*texts: object) -> int:
    return sum(len(str(text).split()) + 1 for text in texts)


def _texts(body: dict[str, Any], field: str) -> list[str]:
    value = body.get(field)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return value
    raise bad_request(f"`{field}` must be a string or a non-empty list of strings")


class TasksApi:
    """The handlers of the task endpoints, over one engine's state."""

    def __init__(self, state: EngineState) -> None:
        self._state = state
        self._ids = itertools.count(1)

    def routes(self) -> list[web.RouteDef]:
        rerank = self._json(self._rerank)
        score = self._json(self._score)
        return [
            web.post("/rerank", rerank),
            web.post("/v1/rerank", rerank),
            web.post("/v2/rerank", rerank),
            web.post("/score", score),
            web.post("/v1/score", score),
            web.post("/classify", self._json(self._classify)),
            web.post("/pooling", self._json(self._pooling)),
            web.post("/v1/audio/transcriptions", self._audio),
            web.post("/v1/audio/translations", self._audio),
        ]

    def _json(
        self, answer: Callable[[dict[str, Any], str, str], object]
    ) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            state = self._state
            with state.in_flight_request():
                refusal = await state.failures.refusal(generation=True)
                if refusal is not None:
                    return refusal
                try:
                    body = parse_object(await request.read())
                    model = requested_model(body, state.config.model, state.models.served)
                    result = answer(body, model, f"{next(self._ids):x}")
                except RequestError as error:
                    return error.response()
                state.served += 1
                return web.Response(body=json_bytes(result), content_type=JSON)

        return handle

    def _rerank(self, body: dict[str, Any], model: str, number: str) -> object:
        query = body.get("query")
        if not isinstance(query, str):
            raise bad_request("`query` must be a string")
        documents = _texts(body, "documents")
        results = [
            {"index": i, "document": {"text": doc}, "relevance_score": _unit(query, doc)}
            for i, doc in enumerate(documents)
        ]
        results.sort(key=lambda result: -float(str(result["relevance_score"])))
        top_n = body.get("top_n")
        if isinstance(top_n, int) and top_n > 0:
            results = results[:top_n]
        tokens = _tokens(query, *documents)
        return {
            "id": f"rerank-{number}",
            "model": model,
            "usage": {"total_tokens": tokens},
            "results": results,
        }

    def _score(self, body: dict[str, Any], model: str, number: str) -> object:
        first, second = _texts(body, "text_1"), _texts(body, "text_2")
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second):
            raise bad_request("`text_1` and `text_2` must have the same length")
        data = [
            {"index": i, "object": "score", "score": _unit(a, b)}
            for i, (a, b) in enumerate(zip(first, second, strict=True))
        ]
        return self._list(f"score-{number}", model, data, _tokens(*first, *second))

    def _classify(self, body: dict[str, Any], model: str, number: str) -> object:
        inputs = _texts(body, "input")
        data = []
        for i, text in enumerate(inputs):
            positive = _unit(text)
            data.append(
                {
                    "index": i,
                    "label": _LABELS[positive >= 0.5],
                    "probs": [round(1 - positive, 6), positive],
                    "num_classes": len(_LABELS),
                }
            )
        return self._list(f"classify-{number}", model, data, _tokens(*inputs))

    def _pooling(self, body: dict[str, Any], model: str, number: str) -> object:
        inputs = _texts(body, "input")
        data = [
            {
                "index": i,
                "object": "pooling",
                "data": [_unit(text, d) for d in range(_POOLED_DIMENSIONS)],
            }
            for i, text in enumerate(inputs)
        ]
        return self._list(f"pool-{number}", model, data, _tokens(*inputs))

    @staticmethod
    def _list(answer_id: str, model: str, data: list[Any], tokens: int) -> object:
        return {
            "id": answer_id,
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }

    async def _audio(self, request: web.Request) -> web.StreamResponse:
        """A transcription or translation: the form's `file` heard as words about its size."""
        state = self._state
        with state.in_flight_request():
            refusal = await state.failures.refusal(generation=True)
            if refusal is not None:
                return refusal
            try:
                if not request.content_type.startswith("multipart/"):
                    raise bad_request("request body must be multipart/form-data")
                form = await request.post()
                model_field = form.get("model")
                audio = form.get("file")
                if not isinstance(model_field, str):
                    raise bad_request("the form must have a `model` field")
                if not isinstance(audio, web.FileField):
                    raise bad_request("the form must have a `file` part")
                body = {"model": model_field}
                requested_model(body, state.config.model, state.models.served)
                size = len(audio.file.read())
            except RequestError as error:
                return error.response()
            state.served += 1
            text = f"{state.name} heard {size} bytes"
            answer = {"text": text, "usage": {"type": "duration", "seconds": max(1, size // 32000)}}
            return web.Response(body=json_bytes(answer), content_type=JSON)
