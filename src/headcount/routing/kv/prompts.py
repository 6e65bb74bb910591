"""A proxied request's prompt token ids for the `kv-aware` policy, without stalling the loop.

- With the router's tokenizer (`--tokenizer`): `tokens.prompt_ids` on the
  event loop, the code the engine uses. Repeated text (system prompts, earlier
  turns) comes from the tokenizer's segment cache, so only new text costs.
  Bodies over `inline_max` bytes are not tokenized: at that
  size fresh text could hold the loop for more than a few milliseconds, so the
  request is routed by load.
- Without one: an engine's own `POST /tokenize` (vLLM's chat or completion
  form), asked of one candidate on the proxy's keep-alive pools, within
  `timeout` and reading at most `answer_max` bytes. Any failure (timeout,
  refusal, a malformed or oversize answer, a connection error) gives None:
  the request is routed by load, never failed for tokenizing.

A completion prompt given as token ids is used as it is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from headcount._http.errors import UpstreamError
from headcount._http.pool import Upstreams
from headcount._http.upstream import ResponseHead, UpstreamConnection
from headcount.fleet import Engine
from headcount.tokens import ChatTokenizer, PromptKind, TokenizerError, prompt_ids
from headcount.tokens.requests import completion_prompt

__all__ = ["EngineTokenize", "local_ids", "tokenize_body"]

_CHAT_FIELDS = (
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "tools",
    "chat_template",
    "chat_template_kwargs",
)
"""What vLLM's `/tokenize` chat form reads of a chat request."""


def local_ids(
    body: Mapping[str, Any], kind: PromptKind, tokenizer: ChatTokenizer
) -> list[int] | None:
    """The prompt's ids by the router's tokenizer; None if the body cannot be tokenized (the
    engine will refuse it itself)."""
    try:
        return prompt_ids(body, kind, tokenizer)
    except TokenizerError:
        return None


def tokenize_body(body: Mapping[str, Any], kind: PromptKind) -> dict[str, Any] | list[int] | None:
    """The `/tokenize` request for a chat or completion body; a completion prompt's ids when
    it gives them; None when it is malformed (the engine will refuse it itself)."""
    if kind == "chat":
        asked = {name: body[name] for name in _CHAT_FIELDS if name in body}
    else:
        try:
            prompt = completion_prompt(body)
        except TokenizerError:
            return None
        if not isinstance(prompt, str):
            return prompt or None
        asked = {"prompt": prompt}
        if "add_special_tokens" in body:
            asked["add_special_tokens"] = body["add_special_tokens"]
    asked["model"] = body.get("model")
    return asked


class EngineTokenize:
    """Asks engines' `POST /tokenize`, on the proxy's keep-alive connections."""

    def __init__(self, upstreams: Upstreams, *, timeout: float, answer_max: int) -> None:
        self._upstreams = upstreams
        self._timeout = timeout
        self._answer_max = answer_max

    async def ids(
        self, engine: Engine, body: Mapping[str, Any], kind: PromptKind
    ) -> list[int] | None:
        """The prompt's ids as `engine` tokenizes them, or None (see the module docstring)."""
        asked = tokenize_body(body, kind)
        if not isinstance(asked, dict):
            return asked
        payload = json.dumps(asked, separators=(",", ":")).encode()
        pool = self._upstreams.pool(engine.id, engine.url)
        answer = _Answer(self._answer_max)
        conn: UpstreamConnection | None = None
        try:
            async with asyncio.timeout(self._timeout):
                conn = pool.take() or await pool.connect()
                conn.send(
                    b"".join(
                        (
                            b"POST /tokenize HTTP/1.1\r\n",
                            pool.host_header,
                            b"content-type: application/json\r\n",
                            b"content-length: %d\r\n\r\n" % len(payload),
                            payload,
                        )
                    ),
                    answer,
                )
                raw = await answer.body
        except (TimeoutError, UpstreamError):
            raw = None
        finally:
            if conn is not None and not answer.complete:
                conn.cancel()
        return None if raw is None else _tokens(raw)


class _Answer:
    """The `ResponseListener` of one `/tokenize` call: the 200 body, or None."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self.complete = False
        self.body: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()

    def on_response(self, head: ResponseHead | None, body: bytes, complete: bool) -> None:
        if self.body.done():
            return
        self.complete = complete
        if head is not None and head.status != 200:
            self.body.set_result(None)
            return
        self._size += len(body)
        if self._size > self._limit:
            self.body.set_result(None)
            return
        self._parts.append(body)
        if complete:
            self.body.set_result(b"".join(self._parts))

    def on_upstream_error(self, error: UpstreamError) -> None:
        self.complete = True  # the connection is closed already
        if not self.body.done():
            self.body.set_result(None)


def _tokens(raw: bytes) -> list[int] | None:
    try:
        answer = json.loads(raw)
    except ValueError:
        return None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if (
        isinstance(tokens, list)
        and tokens
        and all(isinstance(item, int) and not isinstance(item, bool) for item in tokens)
    ):
        return tokens
    return None
