"""What a stream has told its client so far: whole events only, read back when its engine fails.

Resuming a stream on another engine (`resume.py`) needs the text the client
already has, how many tokens it took, and the ids its chunks carried. Reading
every event as it passes would cost the hot path a JSON parse per chunk, so a
`Transcript` only keeps the bytes it relays (by reference) and reads them
when asked (`relayed`), or when they pass `_KEPT_MAX`: then they are folded
into a `Relayed` summary and dropped, so a long stream holds its text, not
its chunks. Folding reads a plain token chunk in vLLM's layout by a regular
expression (`_PLAIN`, a seventh of a JSON parse), anything else as JSON.

A client must never get half an event: the seam would splice the next
engine's chunk into it. So `relay` forwards up to the last event boundary of
what it was given and holds the rest until the next piece completes it. An
engine writes one event per chunk, so the boundary is nearly always the
piece's end (one `endswith`). An event longer than `_MAX_HELD` is no chat
chunk: the transcript gives up (`broken`), forwards it, and the stream is not
resumed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ID_FIELDS", "Relayed", "Transcript", "boundary", "read_events", "split_events"]

_KEPT_MAX = 64 * 1024
"""Relayed bytes kept before they are folded: a chat chunk is ~250 bytes, so ~250 chunks."""
_MAX_HELD = 1024 * 1024
"""Bytes of one unfinished event held back; more is not an engine's chunk."""
_STRING = rb'"((?:[^"\\]|\\.)*)"'
_PLAIN = re.compile(
    rb'"choices":\[\{"index":0,(?:"delta":\{"content":' + _STRING + rb"\}|"
    rb'"text":' + _STRING + rb'),"logprobs":null,"finish_reason":null(?:,"stop_reason":null)?'
    rb'\}\](?:,"usage":null)?\}\Z'
)
"""One choice's token and nothing else to note (no finish, tool call, reasoning or usage),
as vLLM writes a chat or completion chunk: the text is the first or second group."""
ID_FIELDS = ("id", "created", "model", "system_fingerprint")
"""What every chunk of one answer repeats, and a resumed answer must keep."""


@dataclass(slots=True)
class Relayed:
    """A summary of the events relayed: what resuming needs, nothing else."""

    text: list[str] = field(default_factory=list)
    """The answer's text pieces (`delta.content` of a chat, `text` of a completion)."""
    tokens: int = 0
    """Chunks that carried text: one token each, as vLLM streams by default."""
    usage_tokens: int | None = None
    """`completion_tokens` of the last chunk with usage (`continuous_usage_stats`): exact."""
    ids: dict[str, Any] | None = None
    """`ID_FIELDS` of the first chunk."""
    finished: bool = False
    """A `finish_reason`, the usage event or an error was relayed: nothing is left to say."""
    done: bool = False
    """`data: [DONE]` was relayed."""
    tool_call: bool = False
    """A tool-call delta was relayed: its arguments may be partial JSON."""
    reasoning: bool = False
    """Reasoning text was relayed (`reasoning_content`): a continuation would lose it."""
    unreadable: bool = False
    """An event was not JSON, or not a chunk's shape."""

    @property
    def completion_tokens(self) -> int:
        """The tokens relayed: the engine's count when it gave one, else the chunks'."""
        return self.tokens if self.usage_tokens is None else self.usage_tokens


class Transcript:
    """The whole events of one stream relayed to its client; see the module docstring."""

    __slots__ = ("_folded", "_held", "_kept", "_size", "broken")

    def __init__(self) -> None:
        self._held = b""
        self._kept: list[bytes] = []
        self._size = 0
        self._folded: Relayed | None = None
        self.broken = False

    def relay(self, body: bytes) -> bytes:
        """What of `body` (after what was held) the client may get now: whole events."""
        if self._held:
            body = self._held + body
            self._held = b""
        if not body.endswith(b"\n\n"):
            cut = boundary(body)
            if len(body) - cut > _MAX_HELD:
                self.broken = True
                cut = len(body)
            self._held = body[cut:]
            body = body[:cut]
        if body:
            self._kept.append(body)
            self._size += len(body)
            if self._size > _KEPT_MAX:
                self._fold()
        return body

    def rest(self) -> bytes:
        """What is still held, at the stream's end: the client gets it as the engine sent it."""
        held, self._held = self._held, b""
        return held

    def relayed(self) -> Relayed:
        """The summary of every event relayed so far, once the stream broke: the unfinished
        event held back is dropped (the client never gets it)."""
        self._held = b""
        return self._fold()

    def _fold(self) -> Relayed:
        folded = self._folded
        if folded is None:
            folded = self._folded = Relayed()
        if self._kept:
            read_events(folded, b"".join(self._kept))
            self._kept = []
            self._size = 0
        return folded


def boundary(data: bytes) -> int:
    """The offset just past the last event boundary in `data` (0: none)."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def split_events(data: bytes) -> list[bytes]:
    """The `data:` payloads of the whole events in `data`, in order (comments skipped)."""
    payloads = []
    for event in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if lines:
            payloads.append(b"\n".join(lines))
    return payloads


def read_events(relayed: Relayed, data: bytes) -> None:
    """Add the whole events in `data` to `relayed`."""
    for payload in split_events(data):
        if payload == b"[DONE]":
            relayed.done = True
            continue
        plain = _PLAIN.search(payload) if relayed.ids is not None else None
        if plain is not None:
            text = plain.group(1) or plain.group(2)
            if text:
                relayed.text.append(
                    json.loads(b'"' + text + b'"') if b"\\" in text else text.decode()
                )
                relayed.tokens += 1
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            relayed.unreadable = True
            continue
        if isinstance(chunk, dict):
            _read_chunk(relayed, chunk)
        else:
            relayed.unreadable = True


def _read_chunk(relayed: Relayed, chunk: dict[str, Any]) -> None:
    if relayed.ids is None:
        relayed.ids = {name: chunk[name] for name in ID_FIELDS if name in chunk}
    if "error" in chunk:
        relayed.finished = True
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        completion = usage.get("completion_tokens")
        if isinstance(completion, int):
            relayed.usage_tokens = completion
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        if "error" not in chunk:
            relayed.unreadable = True
        return
    if not choices and isinstance(usage, dict):
        relayed.finished = True  # the usage event comes after the last token
    for choice in choices:
        if isinstance(choice, dict):
            _read_choice(relayed, choice)
        else:
            relayed.unreadable = True


def _read_choice(relayed: Relayed, choice: dict[str, Any]) -> None:
    if choice.get("finish_reason") is not None:
        relayed.finished = True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if delta.get("tool_calls"):
            relayed.tool_call = True
        if delta.get("reasoning_content") or delta.get("reasoning"):
            relayed.reasoning = True
        text = delta.get("content")
    else:
        text = choice.get("text")
    if isinstance(text, str) and text:
        relayed.text.append(text)
        relayed.tokens += 1
