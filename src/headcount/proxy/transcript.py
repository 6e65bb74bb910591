"""What a stream has told its client so far: whole events only, read back when its engine fails.

Resuming a stream on another engine (`resume.py`) needs the text the client
already has, how many tokens it took, and the ids its chunks carried. Reading
every event as it passes would cost the hot path a JSON parse per chunk, so a
`Transcript` only keeps the bytes it relays (by reference) and reads them
when asked (`relayed`), or when they pass `_KEPT_MAX`: then they are folded
into a `Relayed` summary and dropped, so a long stream holds its text, not
its chunks. Folding parses an event as JSON only until it has seen one plain
token chunk (one choice, its text and nothing else to note): that chunk's
bytes before and after its text are the stream's frame (`Relayed.frame`), the
same for every such chunk of one answer (vLLM repeats the id, created and
model), so a later event inside that frame is a token whose text is the bytes
between. A fold's run of such events, nearly all of it, is one `split` at the
frame's seams and one `join` of the texts (`_read_framed`), whatever their
number; only the events around it are parsed.

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
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ID_FIELDS", "Relayed", "Transcript", "boundary", "read_events", "split_events"]

_KEPT_MAX = 64 * 1024
"""Relayed bytes kept before they are folded: a chat chunk is ~250 bytes, so ~250 chunks."""
_MAX_HELD = 1024 * 1024
"""Bytes of one unfinished event held back; more is not an engine's chunk."""
_TEXT_KEYS = (b'"content":"', b'"text":"')
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
    frame: tuple[bytes, bytes] | None = None
    """A plain token chunk's bytes before and after its text (module docstring)."""

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
        if len(self._held):
            body = self._held + body
            self._held = b""
        if not body.endswith(b"\n\n"):
            cut = boundary(body)
            if len(body) - cut > _MAX_HELD:
                self.broken = True
                cut = len(body)
            self._held = body[cut:]
            body = body[:cut]
        if len(body):
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


def _payload(event: bytes) -> bytes | None:
    """An event's `data:` lines joined (None: a comment, or no data)."""
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def split_events(data: bytes) -> list[bytes]:
    """The `data:` payloads of the whole events in `data`, in order (comments skipped)."""
    payloads = (_payload(event) for event in data.replace(b"\r\n", b"\n").split(b"\n\n"))
    return [payload for payload in payloads if payload is not None]


def read_events(relayed: Relayed, data: bytes) -> None:
    """Add the whole events in `data` to `relayed`."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    data = _read_framed(relayed, data)
    at, size = 0, len(data)
    while at < size:
        cut = data.find(b"\n\n", at)
        if cut < 0:
            cut = size
        event, at = data[at:cut], cut + 2
        payload = _payload(event)
        if payload is None:
            continue
        if payload == b"[DONE]":
            relayed.done = True
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            relayed.unreadable = True
            continue
        if not isinstance(chunk, dict):
            relayed.unreadable = True
            continue
        tokens = relayed.tokens
        _read_chunk(relayed, chunk)
        if relayed.frame is None and relayed.tokens > tokens and _plain(chunk):
            relayed.frame = _frame(event, relayed.text[-1])
            if relayed.frame is not None:  # the rest, framed
                data = _read_framed(relayed, data[at:])
                at, size = 0, len(data)


def _read_framed(relayed: Relayed, data: bytes) -> bytes:
    """Add the plain token events in the stream's frame that `data` begins with, up to the
    last, when nothing else is among them; the rest of `data`, to be read event by event.

    Their texts are then what lies between the frame's seams (`after`, the boundary,
    `before`), and none holds a quote, an escape or an event boundary."""
    frame = relayed.frame
    if frame is None:
        return data
    before, after = frame
    end = after + b"\n\n"
    last = data.rfind(end)
    if last < 0 or not data.startswith(before):
        return data
    texts = data[len(before) : last].split(end + before)
    joined = b"".join(texts)
    if b"\n\n" in joined or b'"' in joined or b"\\" in joined:
        return data
    if joined:
        relayed.text.append(joined.decode())
    relayed.tokens += len(texts) - texts.count(b"")
    return data[last + len(end) :]


def _plain(chunk: dict[str, Any]) -> bool:
    """Whether `chunk` is one choice's text and nothing else to note."""
    choices = chunk.get("choices")
    if chunk.get("usage") is not None or not isinstance(choices, list) or len(choices) != 1:
        return False
    choice = choices[0]
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
        return False
    delta = choice.get("delta")
    return delta is None or (isinstance(delta, dict) and list(delta) == ["content"])


def _frame(event: bytes, text: str) -> tuple[bytes, bytes] | None:
    """`event`'s bytes before and after `text`, written as it is (no escapes), or None."""
    body = text.encode()
    if b'"' in body or b"\\" in body:
        return None
    for key in _TEXT_KEYS:
        at = event.rfind(key + body + b'"')
        if at >= 0:
            start = at + len(key)
            return event[:start], event[start + len(body) :]
    return None


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
