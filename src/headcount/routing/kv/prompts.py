"""A proxied request's prompt token ids for the `kv-aware` policy, without stalling the loop.

- With the router's tokenizer (`--tokenizer`): `tokens.prompt_ids` on the
  event loop, the code the engine uses. Repeated text (system prompts, earlier
  turns) comes from the tokenizer's segment cache, so only new text costs.
  Bodies over `inline_max` bytes are not tokenized: at that
  size fresh text could hold the loop for more than a few milliseconds, so the
  request is routed by load.
- Without one: an engine's own `POST /tokenize` (vLLM's chat or completion
  form), asked of one candidate (`TokenizeTurns`: in turn, not by the load it
  reports, skipping those that failed lately or leave calls unanswered) on the
  proxy's keep-alive pools, within `timeout`, with the `Authorization` a
  forwarded request carries (the engine key, or the client's when the router
  has no keys). Any failure gives None: the request is routed by load, never
  failed for tokenizing. An answer that takes over half of `timeout` is used,
  but counts as a failure for the engine's turns: one answering just in time
  would tax its turns nearly as much as one never answering. The request that
  asks an engine again after its back-off waits `STALLED_AFTER` at most, then
  is routed by load: the call goes on, to learn whether the engine is back.

What an engine answers is bounded by what the request could tokenize to: a
body of B bytes renders to at most B + `TEMPLATE_TOKENS` tokens (a token
covers at least one byte of the text, and JSON spends at least one byte per
character; the template adds its own few), so an answer holding more ids than
that, or longer than `ID_BYTES` per such id, is no prompt's ids: it is not
read on, and the engine is counted as failing. An answer with more ids than
the model's context length (`max_model_len` of its `/v1/models` card) is not
used: vLLM's `/tokenize` does not check the context (the engine refuses the
request itself), so it is not held against the engine.

A completion prompt given as token ids is used as it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from headcount._http.errors import UpstreamError
from headcount._http.pool import Upstreams
from headcount._http.upstream import ResponseHead, ResponseListener, UpstreamConnection
from headcount.auth import Credentials
from headcount.fleet import Engine
from headcount.routing.kv.tokenize_turns import STALLED_AFTER, TokenizeTurns
from headcount.tokens import ChatTokenizer, PromptKind, TokenizerError, prompt_ids
from headcount.tokens.requests import completion_prompt

__all__ = [
    "ID_BYTES",
    "TEMPLATE_TOKENS",
    "EngineTokenize",
    "context_length",
    "local_ids",
    "tokenize_body",
]

_log = logging.getLogger(__name__)

TEMPLATE_TOKENS = 4096
"""Tokens a chat template may add to a body's own text: its markers and fixed text (tool
instructions, a default system prompt), generously."""
ID_BYTES = 12
"""Bytes of a `/tokenize` answer per id at most: ten digits, a comma and a space."""
_ANSWER_OVERHEAD = 1024
"""Bytes of a `/tokenize` answer besides its ids (`count`, `max_model_len`, ...)."""

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


def context_length(engine: Engine, model: str) -> int | None:
    """`max_model_len` of `model` (an adapter's card has none: its base model's) as `engine`'s
    `/v1/models` cards give it, or None."""
    card = _card(engine.cards, model)
    if card is not None and card.get("max_model_len") is None:
        card = _card(engine.cards, card.get("parent"))
    length = None if card is None else card.get("max_model_len")
    return length if type(length) is int else None


def _card(cards: Sequence[Mapping[str, Any]], model: object) -> Mapping[str, Any] | None:
    for card in cards:
        if card.get("id") == model:
            return card
    return None


class EngineTokenize:
    """Asks engines' `POST /tokenize`, on the proxy's keep-alive connections."""

    def __init__(
        self,
        upstreams: Upstreams,
        credentials: Credentials,
        turns: TokenizeTurns,
        *,
        timeout: float,
        answer_max: int,
    ) -> None:
        """`credentials` are read at each call (a reloaded engine key is used at once); `turns`
        chooses the engine asked and hears how each call ended."""
        self._upstreams = upstreams
        self._credentials = credentials
        self._turns = turns
        self._timeout = timeout
        self._answer_max = answer_max
        self._trials: set[asyncio.Future[list[int] | None]] = set()
        """Calls to engines tried again after their back-off, which outlive their requests."""

    async def ids(
        self,
        candidates: Sequence[Engine],
        body: Mapping[str, Any],
        kind: PromptKind,
        *,
        body_size: int,
        authorization: bytes | None,
    ) -> list[int] | None:
        """The prompt's ids as the candidate whose turn it is tokenizes them, or None (see the
        module docstring); `body_size`: the request body's bytes, `authorization`: the
        client's `Authorization` value, if any."""
        asked = tokenize_body(body, kind)
        if not isinstance(asked, dict):
            return asked
        turns = self._turns
        engine = turns.choose(candidates)
        if engine is None:
            return None
        asking = self._ask(engine, asked, body_size + TEMPLATE_TOKENS, authorization)
        if not turns.trying(engine):
            return await asking
        call = asyncio.ensure_future(asking)
        self._trials.add(call)
        call.add_done_callback(self._trial_ended)
        done, _ = await asyncio.wait((call,), timeout=STALLED_AFTER)
        return call.result() if done else None

    def _trial_ended(self, call: asyncio.Future[list[int] | None]) -> None:
        """A trial outlives its request: what it raised is told here, or no one would."""
        self._trials.discard(call)
        if not call.cancelled() and (error := call.exception()) is not None:
            _log.error("a /tokenize trial call failed", exc_info=error)

    async def _ask(
        self, engine: Engine, asked: dict[str, Any], most: int, authorization: bytes | None
    ) -> list[int] | None:
        """`ids`' answer from `engine`, told to the turns."""
        turns = self._turns
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            answer = await self._call(engine, asked, authorization, most)
        except BaseException:
            turns.abandoned(engine)
            raise
        if answer is _Outcome.REFUSED:
            turns.answered(engine)
            return None
        tokens = None if answer is _Outcome.FAILED else _tokens(answer, most)
        if tokens is None:
            turns.failed(engine)
            return None
        if loop.time() - started > self._timeout / 2:
            turns.failed(engine)  # just in time: as much a tax on its turns as a timeout
        else:
            turns.answered(engine)
        length = context_length(engine, asked["model"])
        return None if length is not None and len(tokens) > length else tokens

    async def _call(
        self, engine: Engine, asked: dict[str, Any], authorization: bytes | None, most: int
    ) -> bytes | _Outcome:
        """The 200 answer's body, or how the call ended without one."""
        payload = json.dumps(asked, separators=(",", ":")).encode()
        pool = self._upstreams.pool(engine.id, engine.url)
        answer = _Answer(min(self._answer_max, _ANSWER_OVERHEAD + ID_BYTES * most))
        conn: UpstreamConnection | None = None
        try:
            async with asyncio.timeout(self._timeout):
                conn = pool.take() or await pool.connect()
                conn.send(
                    b"".join(
                        (
                            b"POST /tokenize HTTP/1.1\r\n",
                            pool.host_header,
                            self._authorization(authorization),
                            b"content-type: application/json\r\n",
                            b"content-length: %d\r\n\r\n" % len(payload),
                            payload,
                        )
                    ),
                    answer,
                )
                return await answer.body
        except (TimeoutError, UpstreamError):
            return _Outcome.FAILED
        finally:
            if conn is not None and not answer.complete:
                conn.cancel()

    def _authorization(self, client: bytes | None) -> bytes:
        """What a forwarded request would carry: the engine key's line, nothing when the
        client's key is the router's, else the client's own."""
        line = self._credentials.forward_authorization
        if line is not None:
            return line
        return b"" if client is None else b"authorization: %s\r\n" % client


class _Outcome(Enum):
    REFUSED = "an answer other than 200 (its body is not read)"
    FAILED = "no answer in time, a broken connection, or an answer over its bound"


class _Answer(ResponseListener):
    """The `ResponseListener` of one `/tokenize` call: the 200 body, or how it ended."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self.complete = False
        self.body: asyncio.Future[bytes | _Outcome] = asyncio.get_running_loop().create_future()

    def on_response(self, head: ResponseHead | None, body: bytes, complete: bool) -> None:
        if self.body.done():
            return
        self.complete = complete
        if head is not None and head.status != 200:
            self.body.set_result(_Outcome.REFUSED)
            return
        self._size += len(body)
        if self._size > self._limit:
            self.body.set_result(_Outcome.FAILED)
            return
        self._parts.append(body)
        if complete:
            self.body.set_result(b"".join(self._parts))

    def on_upstream_error(self, error: UpstreamError) -> None:
        self.complete = True  # the connection is closed already
        if not self.body.done():
            self.body.set_result(_Outcome.FAILED)


def _tokens(raw: bytes, most: int) -> list[int] | None:
    """The ids of a `/tokenize` answer, or None if it holds none, or more than `most`."""
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if (
        isinstance(tokens, list)
        and 0 < len(tokens) <= most
        and all(isinstance(item, int) and not isinstance(item, bool) for item in tokens)
    ):
        return tokens
    return None
