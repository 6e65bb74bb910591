"""A vLLM-like inference engine on loopback, so tests, the demo and benchmarks need no GPU.

It speaks the part of the OpenAI API that vLLM serves (`/v1/models` with LoRA
adapters, chat and text completions, streamed or not, embeddings), exposes
vLLM's Prometheus metrics computed from its real state, and fails on demand::

    async with running_engine(EngineSimConfig(adapters=("sql-lora",), max_running=2)) as engine:
        ...  # talk to engine.url
        await engine.set_fail_mode("refuse")  # connects now get ECONNREFUSED
        await engine.set_fail_mode("none")  # listening again, on the same port

Scheduling: at most `max_running` requests generate at once (unlimited by
default); the others wait in FIFO order. Each token takes `token_delay`
seconds. A client that disconnects stops its generation and frees its slot.

Failure modes (`FailMode`), switchable at runtime, also over `POST /sim/fail-mode`:

- `none`: healthy.
- `refuse`: the listening socket and every open connection are closed, so
  connects get ECONNREFUSED; any other mode listens again on the same port.
- `hang`: every non-admin endpoint (including `/health` and `/metrics`) and
  every running stream stops answering until the mode changes.
- `die-mid-stream`: streams send two chunks, then the connection is closed
  without the terminating chunk; non-streaming generation requests get the
  connection closed without a response.
- `http-500`: every `/v1/` endpoint answers 500 with an OpenAI-shaped error;
  `/health` and `/metrics` still answer, like an engine whose model is broken.

The admin API under `/sim/` (`fail-mode`, `adapters`, `stats`) ignores every
failure mode but `refuse`, which can only be undone in-process. Every response
carries `x-engine-name` and echoes `x-request-id`; JSON completions also name
the engine in `system_fingerprint`.

Run alone with `python -m headcount.sim.engine --port 8100 --adapters a,b`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import itertools
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import uvloop
from aiohttp import web
from multidict import istr

__all__ = [
    "FAIL_MODES",
    "EngineSimConfig",
    "FailMode",
    "SimEngine",
    "add_arguments",
    "config_from_args",
    "running_engine",
    "serve_forever",
    "serve_until_signalled",
    "start_engine",
]

FailMode = Literal["none", "refuse", "hang", "die-mid-stream", "http-500"]
FAIL_MODES: tuple[FailMode, ...] = get_args(FailMode)

_DEFAULT_MAX_TOKENS = 16
_MAX_TOKENS_CAP = 4096
_DIE_AFTER_CHUNKS = 2
_UNLIMITED_KV_SLOTS = 256
"""With no `max_running`, KV usage is running / this: small, but moving with load."""
_EMBEDDING_DIMENSIONS = 32
_SHUTDOWN_TIMEOUT = 1.0

_HELP_RUNNING = "Number of requests in model execution batches."
_HELP_WAITING = "Number of requests waiting to be processed."
_HELP_KV = "KV-cache usage. 1 means 100 percent usage."
_HELP_SUCCESS = "Count of successfully processed requests."

_ENGINE_NAME = istr("x-engine-name")
_REQUEST_ID = istr("x-request-id")
_JSON = "application/json"
_PROMETHEUS_HEADERS = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

_VOCABULARY = tuple(
    re.findall(r" ?\w+|[^\w ]", "Hello from the simulated engine, one token at a time.")
)
_TOKEN_JSON = tuple(json.dumps(token).encode() for token in _VOCABULARY)

_Kind = Literal["chat", "completion"]
_ID_PREFIX: dict[_Kind, str] = {"chat": "chatcmpl-", "completion": "cmpl-"}
_OBJECT: dict[_Kind, str] = {"chat": "chat.completion", "completion": "text_completion"}
_CHUNK_OBJECT: dict[_Kind, str] = {"chat": "chat.completion.chunk", "completion": "text_completion"}


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _error_body(status: int, message: str, error_type: str) -> bytes:
    return _json_bytes({"error": {"message": message, "type": error_type, "code": status}})


_HTTP_500_BODY = _error_body(
    500, "simulated engine failure (fail mode http-500)", "InternalServerError"
)


@dataclass(frozen=True)
class EngineSimConfig:
    """How one simulated engine listens, what it serves and how it behaves."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port; `refuse` and back keeps whichever port was picked."""
    model: str = "sim-model"
    adapters: tuple[str, ...] = ()
    """LoRA adapter names, served next to the base model (replaceable at runtime)."""
    token_delay: float = 0.0
    """Seconds per generated token, the first one included."""
    fail_mode: FailMode = "none"
    max_running: int | None = None
    """Requests generating at once; the rest wait. None: no limit."""
    name: str | None = None
    """Reported in `x-engine-name` and `system_fingerprint`; default `host:port`."""
    legacy_metrics: bool = False
    """Expose `vllm:gpu_cache_usage_perc` (vLLM v0) instead of `vllm:kv_cache_usage_perc`."""
    max_model_len: int = 4096

    def __post_init__(self) -> None:
        if self.fail_mode not in FAIL_MODES:
            raise ValueError(f"fail_mode must be one of {', '.join(FAIL_MODES)}")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError("max_running must be at least 1 (or None for no limit)")
        if self.token_delay < 0 or not math.isfinite(self.token_delay):
            raise ValueError("token_delay must be a finite number of seconds >= 0")
        if self.max_model_len < 1:
            raise ValueError("max_model_len must be at least 1")


class _RequestError(Exception):
    """A request the engine refuses, answered with an OpenAI-shaped error."""

    def __init__(self, status: int, message: str, error_type: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type

    def response(self) -> web.Response:
        body = _error_body(self.status, str(self), self.error_type)
        return web.Response(status=self.status, body=body, content_type=_JSON)


def _bad_request(message: str) -> _RequestError:
    return _RequestError(400, message, "BadRequestError")


@dataclass(frozen=True, slots=True)
class _Generation:
    """A validated chat or text completion request."""

    kind: _Kind
    model: str
    stream: bool
    max_tokens: int
    include_usage: bool
    prompt_tokens: int


def _parse_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise _bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad_request("request body must be a JSON object")
    return body


def _requested_model(body: dict[str, Any], base_model: str, served: frozenset[str]) -> str:
    model = body.get("model", base_model)
    if not isinstance(model, str):
        raise _bad_request("`model` must be a string")
    if model not in served:
        raise _RequestError(404, f"The model `{model}` does not exist.", "NotFoundError")
    return model


def _count_words(value: object) -> int:
    """A cheap stand-in for a tokenizer: words in text, one per token id."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, int):
        return 1
    if isinstance(value, list):
        return sum(_count_words(item) for item in value)
    if isinstance(value, dict):
        return _count_words(value.get("content", value.get("text")))
    return 0


def _max_tokens(body: dict[str, Any], kind: _Kind) -> int:
    value = body.get("max_completion_tokens") if kind == "chat" else None
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return _DEFAULT_MAX_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _bad_request("`max_tokens` must be a positive integer")
    return min(value, _MAX_TOKENS_CAP)


def _prompt(body: dict[str, Any], kind: _Kind) -> object:
    field = "messages" if kind == "chat" else "prompt"
    value = body.get(field)
    if kind == "chat" and not isinstance(value, list):
        raise _bad_request("`messages` must be a list")
    if value is None:
        raise _bad_request(f"`{field}` is required")
    return value


def _parse_generation(
    raw: bytes, kind: _Kind, base_model: str, served: frozenset[str]
) -> _Generation:
    body = _parse_object(raw)
    model = _requested_model(body, base_model, served)
    stream_options = body.get("stream_options")
    return _Generation(
        kind=kind,
        model=model,
        stream=body.get("stream") is True,
        max_tokens=_max_tokens(body, kind),
        include_usage=isinstance(stream_options, dict)
        and stream_options.get("include_usage") is True,
        prompt_tokens=_count_words(_prompt(body, kind)),
    )


def _embedding_inputs(body: dict[str, Any]) -> list[object]:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, int) for item in value):
            return [value]
        if all(isinstance(item, str | list) for item in value):
            return value
    raise _bad_request("`input` must be a string, a list of strings or token id lists")


def _embedding(value: object) -> list[float]:
    """A unit vector that depends only on the input."""
    seed = value.encode() if isinstance(value, str) else _json_bytes(value)
    digest = hashlib.blake2b(seed, digest_size=_EMBEDDING_DIMENSIONS).digest()
    raw = [byte - 127.5 for byte in digest]
    norm = math.sqrt(sum(x * x for x in raw))
    return [round(x / norm, 6) for x in raw]


@functools.lru_cache(maxsize=64)
def _text(tokens: int) -> str:
    size = len(_VOCABULARY)
    return "".join(_VOCABULARY[i % size] for i in range(tokens))


def _usage(generation: _Generation) -> dict[str, int]:
    return {
        "prompt_tokens": generation.prompt_tokens,
        "total_tokens": generation.prompt_tokens + generation.max_tokens,
        "completion_tokens": generation.max_tokens,
    }


def _usage_json(generation: _Generation) -> bytes:
    """The usage object, closing the stream's last chunk."""
    return _json_bytes(_usage(generation)) + b"}\n\n"


@dataclass(frozen=True, slots=True)
class _ChunkFrames:
    """Prebuilt bytes around each token of one stream, so a chunk is two joins."""

    first_prefix: bytes
    prefix: bytes
    suffix: bytes
    last_suffix: bytes

    @classmethod
    def build(cls, kind: _Kind, head: bytes) -> _ChunkFrames:
        tail = b',"logprobs":null,"finish_reason":%s,"stop_reason":null}]}\n\n'
        if kind == "chat":
            return cls(
                first_prefix=head + b'"delta":{"role":"assistant","content":',
                prefix=head + b'"delta":{"content":',
                suffix=b"}" + tail % b"null",
                last_suffix=b"}" + tail % b'"length"',
            )
        return cls(head + b'"text":', head + b'"text":', tail % b"null", tail % b'"length"')

    def chunk(self, index: int, last: bool) -> bytes:
        prefix = self.first_prefix if index == 0 else self.prefix
        token = _TOKEN_JSON[index % len(_TOKEN_JSON)]
        return prefix + token + (self.last_suffix if last else self.suffix)

    def all_chunks(self, tokens: int) -> bytes:
        last = tokens - 1
        return b"".join([self.chunk(index, index == last) for index in range(tokens)])


class _Scheduler:
    """Running and waiting requests; enter it to hold a generation slot."""

    def __init__(self, max_running: int | None) -> None:
        self.max_running = max_running
        self.running = 0
        self.waiting = 0
        self._slots = asyncio.Semaphore(max_running) if max_running is not None else None

    @property
    def kv_cache_usage(self) -> float:
        slots = self.max_running or _UNLIMITED_KV_SLOTS
        return min(1.0, self.running / slots)

    async def __aenter__(self) -> None:
        if self._slots is not None:
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
        self.running += 1

    async def __aexit__(self, *exc_info: object) -> None:
        self.running -= 1
        if self._slots is not None:
            self._slots.release()


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class SimEngine:
    """A running simulated engine; get one from `start_engine` or `running_engine`."""

    def __init__(self, config: EngineSimConfig) -> None:
        self.config = config
        self.port = config.port
        self.name = config.name or ""
        self._fail_mode: FailMode = config.fail_mode
        self._unhung = asyncio.Event()
        self._scheduler = _Scheduler(config.max_running)
        self._created = int(time.time())
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex()
        self._served = 0
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._disconnects = 0
        self._stopping = False
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._served_models = frozenset({config.model})
        self._models_body = b""
        self.set_adapters(list(config.adapters))
        self._set_hang_gate(config.fail_mode)

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    @property
    def fail_mode(self) -> FailMode:
        return self._fail_mode

    async def set_fail_mode(self, mode: FailMode) -> None:
        """Switch failure mode; `refuse` closes socket and connections, others listen again."""
        self._apply_fail_mode(mode, keep=None)
        if mode != "refuse" and self._listener is None and not self._stopping:
            await self._listen()

    def set_adapters(self, adapters: list[str]) -> None:
        """Replace the LoRA adapters listed by `/v1/models` and accepted as `model`."""
        model = self.config.model
        cards = [self._model_card(model, root=model, parent=None)]
        cards += [self._model_card(a, root=f"/adapters/{a}", parent=model) for a in adapters]
        self._models_body = _json_bytes({"object": "list", "data": cards})
        self._served_models = frozenset({model, *adapters})

    def stats(self) -> dict[str, object]:
        """What the engine has done and is doing, for tests: the body of `/sim/stats`."""
        return {
            "name": self.name,
            "fail_mode": self._fail_mode,
            "served": self._served,
            "in_flight": self._in_flight,
            "running": self._scheduler.running,
            "waiting": self._scheduler.waiting,
            "disconnects": self._disconnects,
        }

    async def drain(self, timeout: float = 10.0) -> None:
        """Stop as a terminating pod does: refuse new connections, finish what runs, then stop."""
        self._stop_listening()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        await self.stop()

    def _enter(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._in_flight -= 1
        if not self._in_flight:
            self._idle.set()

    async def stop(self) -> None:
        """Close the socket and every connection, cancelling whatever they were doing."""
        if self._stopping:
            return
        self._stopping = True
        self._stop_listening()
        self._drop_connections(keep=None)
        if self._runner is not None:
            await self._runner.cleanup()

    async def _start(self) -> None:
        app = web.Application()
        app.on_response_prepare.append(self._stamp_headers)
        app.add_routes(
            [
                web.get("/v1/models", self._handle_models),
                web.post("/v1/chat/completions", self._handle_chat),
                web.post("/v1/completions", self._handle_completion),
                web.post("/v1/embeddings", self._handle_embeddings),
                web.get("/metrics", self._handle_metrics),
                web.get("/health", self._handle_health),
                web.post("/sim/fail-mode", self._handle_sim_fail_mode),
                web.post("/sim/adapters", self._handle_sim_adapters),
                web.get("/sim/stats", self._handle_sim_stats),
            ]
        )
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=_SHUTDOWN_TIMEOUT,
        )
        await self._runner.setup()
        await self._listen()
        if not self.name:
            self.name = f"{self.config.host}:{self.port}"
        if self._fail_mode == "refuse":
            self._stop_listening()

    async def _listen(self) -> None:
        assert self._runner is not None and self._runner.server is not None
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            self._runner.server, self.config.host, self.port, reuse_address=True, backlog=1024
        )
        self.port = self._listener.sockets[0].getsockname()[1]

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _drop_connections(self, keep: web.RequestHandler | None) -> None:
        server = self._runner.server if self._runner is not None else None
        for handler in server.connections if server is not None else ():
            if handler is not keep:
                handler.force_close()

    def _apply_fail_mode(self, mode: FailMode, keep: web.RequestHandler | None) -> None:
        self._fail_mode = mode
        self._set_hang_gate(mode)
        if mode == "refuse":
            self._stop_listening()
            self._drop_connections(keep)

    def _set_hang_gate(self, mode: FailMode) -> None:
        if mode == "hang":
            self._unhung.clear()
        else:
            self._unhung.set()

    def _model_card(self, model_id: str, root: str, parent: str | None) -> dict[str, object]:
        return {
            "id": model_id,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": self.config.max_model_len,
        }

    def _response_id(self, request: web.Request) -> str:
        return request.headers.get(_REQUEST_ID) or f"{self._id_prefix}{next(self._ids):x}"

    def _note_disconnect(self) -> None:
        if not self._stopping and self._fail_mode != "refuse":
            self._disconnects += 1

    async def _stamp_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[_ENGINE_NAME] = self.name
        request_id = request.headers.get(_REQUEST_ID)
        if request_id is not None:
            response.headers[_REQUEST_ID] = request_id

    # -- failure gates ---------------------------------------------------------------------

    async def _wait_while_hung(self) -> None:
        while self._fail_mode == "hang":
            await self._unhung.wait()

    async def _api_gate(self) -> web.Response | None:
        """Hang while hung; the 500 answer in `http-500`; None when the request may proceed."""
        await self._wait_while_hung()
        if self._fail_mode == "http-500":
            return web.Response(status=500, body=_HTTP_500_BODY, content_type=_JSON)
        return None

    async def _pace(self, tokens: int) -> None:
        """The time `tokens` tokens take to generate, stretched by a hang."""
        if self.config.token_delay:
            await asyncio.sleep(self.config.token_delay * tokens)
        await self._wait_while_hung()

    def _dying(self, sent: int) -> bool:
        return self._fail_mode == "die-mid-stream" and sent >= _DIE_AFTER_CHUNKS

    @staticmethod
    def _die(request: web.Request) -> None:
        """Drop the connection, as a crashing engine does; aiohttp then writes nothing more."""
        if request.transport is not None:
            request.transport.abort()

    # -- OpenAI API --------------------------------------------------------------------------

    async def _handle_models(self, request: web.Request) -> web.Response:
        refusal = await self._api_gate()
        return refusal or web.Response(body=self._models_body, content_type=_JSON)

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generation(request, "chat")

    async def _handle_completion(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generation(request, "completion")

    async def _handle_generation(self, request: web.Request, kind: _Kind) -> web.StreamResponse:
        self._enter()
        try:
            refusal = await self._api_gate()
            if refusal is not None:
                return refusal
            try:
                raw = await request.read()
                generation = _parse_generation(raw, kind, self.config.model, self._served_models)
            except _RequestError as error:
                return error.response()
            async with self._scheduler:
                if generation.stream:
                    return await self._stream(request, generation)
                return await self._complete(request, generation)
        except asyncio.CancelledError:
            self._note_disconnect()
            raise
        finally:
            self._leave()

    async def _complete(self, request: web.Request, generation: _Generation) -> web.Response:
        await self._pace(generation.max_tokens)
        response = web.Response(content_type=_JSON)
        if self._fail_mode == "die-mid-stream":
            self._die(request)
            return response
        response.body = _json_bytes(self._completion_body(request, generation))
        self._served += 1
        return response

    def _completion_body(self, request: web.Request, generation: _Generation) -> dict[str, object]:
        text = _text(generation.max_tokens)
        choice: dict[str, object] = {"index": 0}
        if generation.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason="length", stop_reason=None)
        return {
            "id": _ID_PREFIX[generation.kind] + self._response_id(request),
            "object": _OBJECT[generation.kind],
            "created": int(time.time()),
            "model": generation.model,
            "system_fingerprint": self.name,
            "choices": [choice],
            "usage": _usage(generation),
        }

    async def _stream(self, request: web.Request, generation: _Generation) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Cache-Control": "no-cache"})
        response.content_type = "text/event-stream"
        head, frames = self._stream_head(request, generation)
        ending = b"data: [DONE]\n\n"
        if generation.include_usage:
            ending = head + b'"choices":[],"usage":' + _usage_json(generation) + ending
        try:
            await response.prepare(request)
            if self.config.token_delay or self._fail_mode != "none":
                if not await self._stream_tokens(response, generation, frames):
                    self._die(request)
                    return response
                await response.write(ending)
            else:
                # Tokens that take no time are all ready at once, so they leave in one write.
                await response.write(frames.all_chunks(generation.max_tokens) + ending)
        except ConnectionError:
            self._note_disconnect()
            return response
        self._served += 1
        return response

    async def _stream_tokens(
        self, response: web.StreamResponse, generation: _Generation, frames: _ChunkFrames
    ) -> bool:
        """Write each token as it is generated; False when the engine must die instead."""
        last = generation.max_tokens - 1
        for index in range(generation.max_tokens):
            await self._pace(1)
            if self._dying(index):
                return False
            await response.write(frames.chunk(index, index == last))
        return not self._dying(generation.max_tokens)

    def _stream_head(
        self, request: web.Request, generation: _Generation
    ) -> tuple[bytes, _ChunkFrames]:
        fields = {
            "id": _ID_PREFIX[generation.kind] + self._response_id(request),
            "object": _CHUNK_OBJECT[generation.kind],
            "created": int(time.time()),
            "model": generation.model,
            "system_fingerprint": self.name,
        }
        head = b"data: " + _json_bytes(fields)[:-1] + b","
        return head, _ChunkFrames.build(generation.kind, head + b'"choices":[{"index":0,')

    async def _handle_embeddings(self, request: web.Request) -> web.StreamResponse:
        self._enter()
        try:
            refusal = await self._api_gate()
            if refusal is not None:
                return refusal
            try:
                body = _parse_object(await request.read())
                model = _requested_model(body, self.config.model, self._served_models)
                inputs = _embedding_inputs(body)
            except _RequestError as error:
                return error.response()
            response = web.Response(content_type=_JSON)
            if self._fail_mode == "die-mid-stream":
                self._die(request)
                return response
            response.body = _json_bytes(self._embeddings_body(request, model, inputs))
            self._served += 1
            return response
        except asyncio.CancelledError:
            self._note_disconnect()
            raise
        finally:
            self._leave()

    def _embeddings_body(
        self, request: web.Request, model: str, inputs: list[object]
    ) -> dict[str, object]:
        tokens = _count_words(inputs)
        data = [
            {"index": i, "object": "embedding", "embedding": _embedding(value)}
            for i, value in enumerate(inputs)
        ]
        return {
            "id": "embd-" + self._response_id(request),
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": self.name,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }

    # -- operations endpoints ------------------------------------------------------------------

    async def _handle_health(self, request: web.Request) -> web.Response:
        await self._wait_while_hung()
        return web.Response()

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        await self._wait_while_hung()
        return web.Response(body=self._render_metrics().encode(), headers=_PROMETHEUS_HEADERS)

    def _render_metrics(self) -> str:
        """vLLM's metric names; v1 adds an `engine` label that v0 (legacy) did not have."""
        model = _label_value(self.config.model)
        labels = f'model_name="{model}"'
        if not self.config.legacy_metrics:
            labels = f'engine="0",{labels}'
        success_labels = f'{labels},finished_reason="length"'
        kv_name = "gpu_cache_usage_perc" if self.config.legacy_metrics else "kv_cache_usage_perc"
        scheduler = self._scheduler
        samples = (
            ("num_requests_running", "gauge", _HELP_RUNNING, labels, scheduler.running),
            ("num_requests_waiting", "gauge", _HELP_WAITING, labels, scheduler.waiting),
            (kv_name, "gauge", _HELP_KV, labels, scheduler.kv_cache_usage),
            ("request_success_total", "counter", _HELP_SUCCESS, success_labels, self._served),
        )
        lines: list[str] = []
        for name, kind, help_text, sample_labels, value in samples:
            lines += [
                f"# HELP vllm:{name} {help_text}",
                f"# TYPE vllm:{name} {kind}",
                f"vllm:{name}{{{sample_labels}}} {float(value)}",
            ]
        return "\n".join(lines) + "\n"

    # -- admin API -------------------------------------------------------------------------------

    async def _handle_sim_fail_mode(self, request: web.Request) -> web.Response:
        try:
            mode = _parse_fail_mode(_parse_object(await request.read()).get("mode"))
        except _RequestError as error:
            return error.response()
        response = web.Response(body=_json_bytes({"mode": mode}), content_type=_JSON)
        if mode == "refuse":
            # This connection must live long enough to carry the answer, then close.
            self._apply_fail_mode(mode, keep=request.protocol)
            response.force_close()
        else:
            await self.set_fail_mode(mode)
        return response

    async def _handle_sim_adapters(self, request: web.Request) -> web.Response:
        try:
            adapters = _parse_object(await request.read()).get("adapters")
        except _RequestError as error:
            return error.response()
        if not isinstance(adapters, list) or not all(isinstance(a, str) for a in adapters):
            return _bad_request("`adapters` must be a list of strings").response()
        self.set_adapters(adapters)
        return web.Response(body=_json_bytes({"adapters": adapters}), content_type=_JSON)

    async def _handle_sim_stats(self, request: web.Request) -> web.Response:
        return web.Response(body=_json_bytes(self.stats()), content_type=_JSON)


def _parse_fail_mode(value: object) -> FailMode:
    if value not in FAIL_MODES:
        raise _bad_request(f"`mode` must be one of {', '.join(FAIL_MODES)}")
    return value


async def start_engine(config: EngineSimConfig) -> SimEngine:
    """Start an engine listening on `config.host`; stop it with `await engine.stop()`."""
    engine = SimEngine(config)
    try:
        await engine._start()
    except BaseException:
        await engine.stop()
        raise
    return engine


@contextlib.asynccontextmanager
async def running_engine(config: EngineSimConfig) -> AsyncIterator[SimEngine]:
    """`async with running_engine(config) as engine:` an engine for the block's duration."""
    engine = await start_engine(config)
    try:
        yield engine
    finally:
        await engine.stop()


async def serve_forever(config: EngineSimConfig) -> None:
    """Run an engine until cancelled, announcing its URL on stdout once it listens."""
    async with running_engine(config) as engine:
        sys.stdout.write(f"sim-engine {engine.name} listening on {engine.url}\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().create_future()


def _adapter_list(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in value.split(",") if name.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine simulator's command-line options, defaults from `EngineSimConfig`."""
    defaults = EngineSimConfig()
    parser.add_argument("--host", default=defaults.host, help="address to listen on")
    parser.add_argument("--port", type=int, default=defaults.port, help="0 picks a free port")
    parser.add_argument("--model", default=defaults.model, help="base model name to serve")
    parser.add_argument(
        "--adapters", type=_adapter_list, default=defaults.adapters, help="LoRA adapters, a,b,c"
    )
    parser.add_argument(
        "--token-delay", type=float, default=defaults.token_delay, help="seconds per token"
    )
    parser.add_argument("--fail-mode", choices=FAIL_MODES, default=defaults.fail_mode)
    parser.add_argument(
        "--max-running", type=int, default=defaults.max_running, help="default: no limit"
    )
    parser.add_argument("--name", default=defaults.name, help="default: host:port")
    parser.add_argument(
        "--legacy-metrics",
        action="store_true",
        help="expose vllm:gpu_cache_usage_perc instead of vllm:kv_cache_usage_perc",
    )
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len)


def config_from_args(ns: argparse.Namespace) -> EngineSimConfig:
    """The config that `add_arguments`' parsed options describe."""
    return EngineSimConfig(
        host=ns.host,
        port=ns.port,
        model=ns.model,
        adapters=tuple(ns.adapters),
        token_delay=ns.token_delay,
        fail_mode=ns.fail_mode,
        max_running=ns.max_running,
        name=ns.name,
        legacy_metrics=ns.legacy_metrics,
        max_model_len=ns.max_model_len,
    )


async def serve_until_signalled(config: EngineSimConfig) -> None:
    """`serve_forever` until SIGINT or SIGTERM, then return cleanly."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await serve_forever(config)


def _main(argv: list[str] | None = None) -> None:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m headcount.sim.engine", description=description)
    add_arguments(parser)
    config = config_from_args(parser.parse_args(argv))
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve_until_signalled(config))


if __name__ == "__main__":
    _main()
