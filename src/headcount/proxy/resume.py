"""Resuming a broken stream on another engine: whether it can be exact, the request, the seam.

When a streamed chat or text completion breaks after its first byte, the
rest of the answer is asked of another engine, continuing from the text the
client already has (`Transcript.relayed`):

- chat: the original messages plus an assistant message holding that text,
  with `continue_final_message: true` and `add_generation_prompt: false`
  (vLLM's and SGLang's extensions); a request that already continued its
  final assistant message gets the text appended to it;
- completions with a string prompt: the prompt followed by that text;
- `max_tokens` and `max_completion_tokens` (and vLLM's `min_tokens`) less the
  tokens relayed; a completion without `max_tokens` had vLLM's default, 16;
- everything else unchanged (sampling, `stop`, `seed`, `stream_options`).

It is refused (a reason from `REFUSALS`) where it cannot be exact: `n` > 1,
log probabilities asked for, a completion prompt that is not one string,
structured output (`response_format` with a schema, vLLM's `guided_*`),
`echo`, a tool call or reasoning text relayed, an answer already finished,
or events that could not be read.

The next engine's events then reach the client as the first engine's
(`Seam`): the same `id`, `created`, `model` and `system_fingerprint`, its
first chunk's `role` and empty chunks dropped, and its usage counted from the
original prompt: `completion_tokens` plus the tokens carried over,
`prompt_tokens` less them (exact when the engine tokenizes the relayed text
back into the tokens it came from).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from headcount.proxy.transcript import ID_FIELDS, Relayed, boundary, split_events
from headcount.proxy.usage import COMPACT_JSON

__all__ = [
    "FINISHED",
    "LIMIT",
    "NO_ENGINE",
    "REFUSALS",
    "Kind",
    "Seam",
    "continuation",
]

Kind = Literal["chat", "completion"]

N = "n"
LOGPROBS = "logprobs"
PROMPT = "prompt"
STRUCTURED = "structured_output"
ECHO = "echo"
TOOL_CALL = "tool_call"
REASONING = "reasoning"
FINISHED = "finished"
UNREADABLE = "unreadable"
LIMIT = "limit"
NO_ENGINE = "no_engine"
REFUSALS = (
    N,
    LOGPROBS,
    PROMPT,
    STRUCTURED,
    ECHO,
    TOOL_CALL,
    REASONING,
    FINISHED,
    UNREADABLE,
    LIMIT,
    NO_ENGINE,
)
"""Why a broken stream was not resumed: the `refused_*` outcomes of the resume counter."""

_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
_COMPLETION_MAX_TOKENS = 16
"""vLLM's `max_tokens` for a completion that gives none (a chat's is the context left)."""
_LIMITS = ("max_tokens", "max_completion_tokens")


def continuation(kind: Kind, body: dict[str, Any], relayed: Relayed) -> bytes | str:
    """The request that continues `body`'s answer after `relayed`, or why none can be exact."""
    refused = _refusal(kind, body, relayed)
    if refused is not None:
        return refused
    text, carried = "".join(relayed.text), relayed.completion_tokens
    asked = dict(body)
    if kind == "completion":
        asked["prompt"] = body["prompt"] + text
        if asked.get("max_tokens") is None:
            asked["max_tokens"] = _COMPLETION_MAX_TOKENS
    elif text:
        asked["messages"] = _continued(body, text)
        asked["continue_final_message"] = True
        asked["add_generation_prompt"] = False
    for name in _LIMITS:
        limit = asked.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - carried < 1:
                return FINISHED
            asked[name] = limit - carried
    least = asked.get("min_tokens")
    if isinstance(least, int) and not isinstance(least, bool):
        asked["min_tokens"] = max(0, least - carried)
    return COMPACT_JSON.encode(asked).encode()


def _refusal(kind: Kind, body: dict[str, Any], relayed: Relayed) -> str | None:
    n = body.get("n")
    if n is not None and n != 1:
        return N
    if body.get("logprobs") or body.get("top_logprobs") or body.get("prompt_logprobs"):
        return LOGPROBS
    if kind == "completion" and not isinstance(body.get("prompt"), str):
        return PROMPT
    if kind == "chat" and not isinstance(body.get("messages"), list):
        return PROMPT
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return STRUCTURED
    if any(body.get(name) is not None for name in _GUIDED):
        return STRUCTURED
    if body.get("echo"):
        return ECHO
    if relayed.unreadable:
        return UNREADABLE
    if relayed.tool_call:
        return TOOL_CALL
    if relayed.reasoning:
        return REASONING
    if relayed.finished or relayed.done:
        return FINISHED
    return None


def _continued(body: dict[str, Any], text: str) -> list[Any]:
    """The messages with `text` as the final assistant message's (appended, when the request
    already continued one)."""
    messages: list[Any] = list(body["messages"])
    last = messages[-1] if messages else None
    if (
        body.get("continue_final_message") is True
        and isinstance(last, dict)
        and last.get("role") == "assistant"
        and isinstance(last.get("content"), str)
    ):
        messages[-1] = {**last, "content": last["content"] + text}
    else:
        messages.append({"role": "assistant", "content": text})
    return messages


class Seam:
    """The continuation's events as the first engine's; see the module docstring.

    Feed it the continuation's de-chunked body in order; it returns whole events.
    """

    __slots__ = ("_carried", "_held", "_ids")

    def __init__(self, ids: dict[str, Any] | None, carried: int) -> None:
        self._ids = ids or {}
        self._carried = carried
        self._held = b""

    def rewrite(self, body: bytes) -> bytes:
        data = self._held + body
        cut = boundary(data)
        self._held = data[cut:]
        events = [self._event(payload) for payload in split_events(data[:cut])]
        return b"".join(event for event in events if event is not None)

    def rest(self) -> bytes:
        """What is still held, at the stream's end."""
        held, self._held = self._held, b""
        return held

    def _event(self, payload: bytes) -> bytes | None:
        try:
            chunk = json.loads(payload)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            return b"data: " + payload + b"\n\n"
        ids = self._ids
        for name in ID_FIELDS:
            if name in ids:
                chunk[name] = ids[name]
            else:
                chunk.pop(name, None)
        choices = chunk.get("choices")
        usage = chunk.get("usage")
        if isinstance(choices, list) and choices:
            for choice in choices:
                if isinstance(choice, dict) and isinstance(choice.get("delta"), dict):
                    choice["delta"].pop("role", None)
            if usage is None and all(_empty(choice) for choice in choices):
                return None
        if isinstance(usage, dict):
            _shift(usage, self._carried)
        return b"data: " + COMPACT_JSON.encode(chunk).encode() + b"\n\n"


def _empty(choice: object) -> bool:
    """Whether a choice says nothing: no text, no finish (a continuation's role chunk)."""
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return not any(delta.values())
    return not choice.get("text")


def _shift(usage: dict[str, Any], carried: int) -> None:
    """Usage of a continuation as the whole answer's: the carried tokens were generated."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        usage["prompt_tokens"] = max(0, prompt - carried)
        usage["completion_tokens"] = completion + carried
