"""The bodies the engine answers with, shaped as vLLM's: completions, stream chunks, embeddings.

Streams are the hot path of the router's benchmarks, so a chunk is prebuilt
bytes around a prebuilt token (the request's own answer, `tokens.answer_json`):
two joins, no JSON encoding per token (unless the request asks for usage on
every chunk, `continuous_usage_stats`).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from headcount.sim.engine.parsing import Generation, Kind
from headcount.sim.engine.tokens import answer, answer_json
from headcount.sim.engine.wire import json_bytes

__all__ = [
    "ChunkFrames",
    "completion_body",
    "embeddings_body",
    "stream_head",
    "usage_json",
]

_EMBEDDING_DIMENSIONS = 32

_ID_PREFIX: dict[Kind, str] = {"chat": "chatcmpl-", "completion": "cmpl-"}
_OBJECT: dict[Kind, str] = {"chat": "chat.completion", "completion": "text_completion"}
_CHUNK_OBJECT: dict[Kind, str] = {"chat": "chat.completion.chunk", "completion": "text_completion"}


def _usage(generation: Generation, cached_tokens: int | None) -> dict[str, object]:
    """vLLM's usage; `prompt_tokens_details` only from an engine with a prefix cache."""
    usage: dict[str, object] = {
        "prompt_tokens": generation.prompt_tokens,
        "total_tokens": generation.prompt_tokens + generation.max_tokens,
        "completion_tokens": generation.max_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


def usage_json(generation: Generation, cached_tokens: int | None) -> bytes:
    """The usage object, closing the stream's last chunk."""
    return json_bytes(_usage(generation, cached_tokens)) + b"}\n\n"


def completion_body(
    generation: Generation, response_id: str, name: str, cached_tokens: int | None
) -> dict[str, object]:
    """A whole (non-streamed) chat or text completion, from engine `name`."""
    content = answer(generation.context, generation.max_tokens)
    choice: dict[str, object] = {"index": 0}
    if generation.kind == "chat":
        choice["message"] = {"role": "assistant", "content": content, "tool_calls": []}
    else:
        choice["text"] = content
    choice.update(logprobs=None, finish_reason="length", stop_reason=None)
    return {
        "id": _ID_PREFIX[generation.kind] + response_id,
        "object": _OBJECT[generation.kind],
        "created": int(time.time()),
        "model": generation.model,
        "system_fingerprint": name,
        "choices": [choice],
        "usage": _usage(generation, cached_tokens),
    }


@dataclass(frozen=True, slots=True)
class ChunkFrames:
    """Prebuilt bytes around each of one stream's `tokens` (JSON strings), so a chunk is
    two joins.

    A chunk ends with `close`: a chat chunk has no `usage` (vLLM leaves unset
    fields out), a completion chunk has `"usage":null` (vLLM writes them all);
    with `continuous_prompt` set, every chunk carries its usage so far instead.
    """

    first_prefix: bytes
    prefix: bytes
    suffix: bytes
    last_suffix: bytes
    close: bytes
    tokens: tuple[bytes, ...]
    continuous_prompt: int | None = None

    @classmethod
    def build(
        cls,
        kind: Kind,
        head: bytes,
        tokens: tuple[bytes, ...],
        continuous_prompt: int | None = None,
    ) -> ChunkFrames:
        tail = b',"logprobs":null,"finish_reason":%s,"stop_reason":null}]'
        if kind == "chat":
            close = b"}\n\n"
            return cls(
                first_prefix=head + b'"delta":{"role":"assistant","content":',
                prefix=head + b'"delta":{"content":',
                suffix=b"}" + tail % b"null" + close,
                last_suffix=b"}" + tail % b'"length"' + close,
                close=close,
                tokens=tokens,
                continuous_prompt=continuous_prompt,
            )
        close = b',"usage":null}\n\n'
        return cls(
            head + b'"text":',
            head + b'"text":',
            tail % b"null" + close,
            tail % b'"length"' + close,
            close,
            tokens,
            continuous_prompt,
        )

    def chunk(self, index: int, last: bool) -> bytes:
        prefix = self.first_prefix if index == 0 else self.prefix
        token = self.tokens[index]
        suffix = self.last_suffix if last else self.suffix
        prompt = self.continuous_prompt
        if prompt is None:
            return prefix + token + suffix
        usage = {"prompt_tokens": prompt, "total_tokens": prompt + index + 1}
        usage["completion_tokens"] = index + 1
        closed = b',"usage":' + json_bytes(usage) + b"}\n\n"
        return prefix + token + suffix[: -len(self.close)] + closed

    def all_chunks(self, tokens: int) -> bytes:
        last = tokens - 1
        return b"".join([self.chunk(index, index == last) for index in range(tokens)])


def stream_head(generation: Generation, response_id: str, name: str) -> tuple[bytes, ChunkFrames]:
    """What every chunk of one stream starts with (``data: {"id":...,``) and its frames."""
    fields = {
        "id": _ID_PREFIX[generation.kind] + response_id,
        "object": _CHUNK_OBJECT[generation.kind],
        "created": int(time.time()),
        "model": generation.model,
        "system_fingerprint": name,
    }
    head = b"data: " + json_bytes(fields)[:-1] + b","
    continuous = generation.prompt_tokens if generation.continuous_usage else None
    tokens = answer_json(generation.context, generation.max_tokens)
    frames = ChunkFrames.build(
        generation.kind, head + b'"choices":[{"index":0,', tokens, continuous
    )
    return head, frames


def _embedding(value: object) -> list[float]:
    """A unit vector that depends only on the input."""
    seed = value.encode() if isinstance(value, str) else json_bytes(value)
    digest = hashlib.blake2b(seed, digest_size=_EMBEDDING_DIMENSIONS).digest()
    raw = [byte - 127.5 for byte in digest]
    norm = math.sqrt(sum(x * x for x in raw))
    return [round(x / norm, 6) for x in raw]


def embeddings_body(
    model: str, inputs: list[object], response_id: str, name: str, tokens: int
) -> dict[str, object]:
    data = [
        {"index": i, "object": "embedding", "embedding": _embedding(value)}
        for i, value in enumerate(inputs)
    ]
    return {
        "id": "embd-" + response_id,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": name,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }
