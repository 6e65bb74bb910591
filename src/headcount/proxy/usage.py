"""Token accounting on the data plane: ask a stream for its usage, read the engine's numbers.

Settling a tenant's token reservation needs the `usage` the engine reports.
A whole answer (`chat.completion`, `text_completion`, embeddings' `list`)
carries it as a top-level object near its end. A stream carries it only when
the request asks (`stream_options.include_usage`), as one event of its own
(`choices: []`, then `data: [DONE]`); `ask_usage` adds the ask, and a
`UsageTap` that must drop removes that event, so a client that did not ask
sees exactly the bytes it would have seen without the router.

vLLM reads `stream_options` as pydantic does: present with `include_usage`
absent means true (its default), and `continuous_usage_stats` takes effect
only with `include_usage`, so turning usage on turns continuous stats off
unless the client had them on. A value neither boolean nor null is left to
the engine: nothing is changed and nothing dropped.

The tap is on the hot path. Forwarding without dropping, `feed` keeps the
last pieces by reference (at least `_WINDOW` bytes) and `end` parses the last
`"usage":{` object among them, once (vLLM's layout by a regular expression,
anything else as JSON). Dropping, `feed` holds back only the
bytes after the last event boundary and parses only events holding
`"usage":{`, which in compact JSON is always a key. A piece whose last event
ends its choices (`}]}`) or says it has no usage (`"usage":null}`) holds no
usage event, which comes last; nor does `data: [DONE]` alone, nor an empty
piece: such a piece is passed on without a search (a search
costs a method call, about a microsecond a stream). Nothing here raises on a
malformed body: the numbers stay None.

Costs on CPython 3.11, compiled: the constants are `Final` (any other module
global is looked up in the module's dict at every use), and substrings are
looked for with `find`, never `in`: a bytes `in` first tries its operand as an
integer and formats a TypeError, twice the cost of the call.
"""

from __future__ import annotations

import json
from typing import Any, Final

from headcount.proxy.headers import is_event_stream

__all__ = ["COMPACT_JSON", "UsageTap", "ask_usage", "client_asks_usage", "usage_of"]

_USAGE: Final = b'"usage":{'
_OPEN: Final = len(_USAGE) - 1
"""Offset of the usage object's `{` from the key's first quote."""
_WINDOW: Final = 16384
"""Bytes kept from the end of a forwarded answer. vLLM writes `usage` last or nearly: only a
chat answer's `prompt_logprobs`, `prompt_token_ids` (asked for) and `kv_transfer_params`
follow it; more than this after it and the numbers are None. Searching every byte instead
would cost the router about 0.2 ns a byte of every large answer (embeddings)."""
_TRIM_AT: Final = 2 * _WINDOW
_USAGE_SPAN: Final = 1024
"""Bytes read after a `"usage":` key: its object is under 200, details included."""
_ATTEMPTS: Final = 4
"""`"usage":{` keys tried from the end, should the last be cut or not usage."""
_MAX_HELD: Final = 65536
"""Bytes of one unfinished event held back; a longer event is no usage event."""
_EMPTY_CHOICES: Final = b'"choices":[]'
_CHOICES_THEN_USAGE: Final = b'"choices":[],'
"""How vLLM's usage event has it, just before its `"usage":{`."""
_CHOICES_END: Final = b"}]}\n\n"
_NULL_USAGE_END: Final = b'"usage":null}\n\n'
"""Ends of a piece whose last event is no usage event: a chunk with choices (vLLM), or one
saying it has none (vLLM's completion chunks and SGLang's carry `"usage":null`)."""
_DONE_EVENT: Final = b"data: [DONE]\n\n"
"""A stream's last event, often a piece of its own."""
_PROMPT_KEY: Final = b'{"prompt_tokens":'
_TOTAL_KEY: Final = b',"total_tokens":'
_COMPLETION_KEY: Final = b',"completion_tokens":'
"""vLLM's usage opens as pydantic writes it, these keys each followed by a count: read by
`_vllm_usage` without a JSON parse (a third of the time) or a regular expression (compiled,
a regular expression and `int` cost about ten times the slices and digit sums)."""
_LF: Final = 10
_CR: Final = 13
_MAX_DIGITS: Final = 18
"""Digits of a count read by `_vllm_usage`: a longer one is left to the JSON parse."""
_ASKING = b'{"stream_options":{"include_usage":true},'
"""A body's opening brace with the ask after it; a JSON object with a key follows."""
_DECODER = json.JSONDecoder()
COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""Made once: `json.dumps` with options makes one a call (a quarter of its time)."""


def client_asks_usage(body: dict[str, Any]) -> bool:
    """Whether vLLM ends this stream with its usage event by itself, as it reads the body."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage", True) is True


def ask_usage(body: dict[str, Any], raw: bytes = b"") -> bytes | None:
    """The stream's body asking for its usage event, or None when it needs no change.

    None for a body that is not a stream, that asks already, or whose
    `stream_options` vLLM would refuse or read in a way this does not: the
    engine decides, and the tap must not drop. Bytes mean the client did not
    ask: forward them instead and drop the usage event (`UsageTap`). A body
    without `stream_options` whose bytes `raw` are given gets the ask spliced
    in after its opening brace (no key can repeat), not the whole body encoded
    again: a tenth of the work.
    """
    if body.get("stream") is not True:
        return None
    if "stream_options" not in body and raw.startswith(b"{"):
        return _ASKING + raw[1:]
    options = body.get("stream_options")
    if options is None:
        options = {"include_usage": True}
    elif not isinstance(options, dict):
        return None
    else:
        asked = options.get("include_usage", True)
        if asked is not False and asked is not None:
            return None
        options = {**options, "include_usage": True}
        if options.get("continuous_usage_stats") not in (None, False):
            options["continuous_usage_stats"] = False  # it was off with include_usage off
    asking = {**body, "stream_options": options}
    return COMPACT_JSON.encode(asking).encode()


class UsageTap:
    """One response's body, fed in order: what the client gets, and the engine's numbers.

    `feed` each de-chunked piece and forward what it returns; at the end (or
    when the engine went away) forward what `end` returns, or do both with
    `through`. Then `prompt_tokens` and `completion_tokens` are the engine's,
    or None.
    """

    __slots__ = (
        "_drop",
        "_held",
        "_kept",
        "_window",
        "completion_tokens",
        "dropped",
        "prompt_tokens",
    )

    def __init__(self, *, event_stream: bool, drop_usage: bool = False) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.dropped = 0
        """Bytes `through` kept from the client (the usage event it did not ask for)."""
        self._drop = event_stream and drop_usage
        self._held = b""
        self._window: list[bytes] = []
        self._kept = 0

    @staticmethod
    def for_response(content_type: bytes | None, drop_usage: bool) -> UsageTap:
        """The tap for an answer of this `Content-Type`: an error answers a stream in JSON."""
        return UsageTap(event_stream=is_event_stream(content_type), drop_usage=drop_usage)

    def reported(self) -> tuple[int | None, int | None] | None:
        """The engine's prompt and completion tokens, None when it reported neither."""
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return self.prompt_tokens, self.completion_tokens

    def through(self, piece: bytes, complete: bool) -> bytes:
        """What to forward of `piece`, the answer's next, and of what was held back when it is
        the last (`complete`)."""
        if self._drop and not complete and len(self._held) == 0 and _no_usage_event(piece):
            return piece  # most pieces of a stream: a call and a count less
        forwarded = self.feed(piece)
        if complete:
            rest = self.end()
            if len(rest):  # compiled, `+` copies both sides even when one is empty
                forwarded += rest
        self.dropped += len(piece) - len(forwarded)
        return forwarded

    def feed(self, piece: bytes) -> bytes:
        if not self._drop:
            self._window.append(piece)
            self._kept += len(piece)
            if self._kept > _TRIM_AT:
                self._trim()
            return piece
        if len(self._held):
            piece = self._held + piece
            self._held = b""
        if _no_usage_event(piece):
            return piece
        if not piece.endswith(b"\n\n"):  # hold back the unfinished event, if not too long
            cut = _after_boundary(piece, 0, len(piece))
            if len(piece) - cut <= _MAX_HELD:
                self._held = piece[cut:]
                piece = piece[:cut]
        # rfind: CPython's backward search skips faster than `in` on JSON
        found = piece.rfind(_USAGE)
        return piece if found < 0 else self._strip(piece, found)

    def _trim(self) -> None:
        """Forget the oldest pieces, keeping at least `_WINDOW` bytes: once per `_WINDOW` fed."""
        window = self._window
        kept = self._kept
        first = 0
        while kept - len(window[first]) >= _WINDOW:
            kept -= len(window[first])
            first += 1
        del window[:first]
        self._kept = kept

    def end(self) -> bytes:
        """What is left to forward; the numbers are read by now."""
        if not self._drop:
            self._read_tail(b"".join(self._window))
            self._window.clear()
            return b""
        held, self._held = self._held, b""
        if len(held) == 0:
            return b""
        found = held.rfind(_USAGE)
        if found >= 0 and self._read_event(held, 0, found, len(held)):
            return b""  # the usage event without its blank line
        if held.find(_EMPTY_CHOICES) >= 0:
            return b""  # the usage event, cut: no other event has no choices
        return held

    def _strip(self, data: bytes, found: int) -> bytes:
        """`data` (whole events) without the usage event, its numbers read, when it is the
        event holding the last `"usage":{` at `found`: the usage event comes last, and any
        before it (continuous usage stats) is kept and superseded. Only that event is
        searched, not all of `data` (a whole stream, when it came in one read)."""
        nl = data.find(b"\n")
        if nl > found:  # no line before it: the piece opens with it (vLLM writes it alone)
            start, end = 0, _boundary_from(data, nl)
        else:
            start, end = _after_boundary(data, 0, found), _next_boundary(data, found)
        if not self._read_event(data, start, found, end):
            return data
        if start == 0:  # the piece opens with the usage event: one copy, not three
            return data[end:]
        return data[:start] if end == len(data) else data[:start] + data[end:]

    def _read_event(self, data: bytes, start: int, found: int, end: int) -> bool:
        """Read the numbers of the event `data[start:end]`, whose last `"usage":{` is at
        `found`; True when it is the usage event (no other has no choices)."""
        numbers: tuple[int | None, int | None] | None = _vllm_usage(data, found + _OPEN)
        if numbers is None:
            numbers = usage_of(data[start:end])
        if numbers is None:
            return False
        self.prompt_tokens, self.completion_tokens = numbers
        before = found - len(_CHOICES_THEN_USAGE)
        if before >= start and data[before:found] == _CHOICES_THEN_USAGE:
            return True
        return data.find(_EMPTY_CHOICES, start, end) >= 0

    def _read_tail(self, tail: bytes) -> bool:
        """Read the numbers of the last `usage` object in `tail` that has them; False if none."""
        numbers = usage_of(tail)
        if numbers is None:
            return False
        self.prompt_tokens, self.completion_tokens = numbers
        return True


def _no_usage_event(piece: bytes) -> bool:
    """Whether `piece` (whole events, or the start of one) surely holds no usage event, which
    comes last: see the module docstring."""
    return (
        len(piece) == 0  # the end of a chunked body comes as an empty piece
        or piece.endswith(_CHOICES_END)
        or piece.endswith(_NULL_USAGE_END)
        or piece == _DONE_EVENT
    )


def usage_of(tail: bytes) -> tuple[int | None, int | None] | None:
    """The prompt and completion tokens of the last `usage` object in `tail` that has either
    (a whole answer, or the end of one); None when none has."""
    found = tail.rfind(_USAGE)
    if found < 0:
        return None
    vllm = _vllm_usage(tail, found + _OPEN)
    if vllm is not None:  # the common answer
        return vllm
    for _ in range(_ATTEMPTS):
        numbers = _parsed_usage(tail, found + _OPEN)
        if numbers is not None:
            return numbers
        found = tail.rfind(_USAGE, 0, found)
        if found < 0:
            return None
    return None


def _vllm_usage(tail: bytes, start: int) -> tuple[int, int] | None:
    """The prompt and completion tokens of the usage object at `start` in `tail` when it
    opens as vLLM writes one, else None."""
    prompt, at = _count_after(tail, start, _PROMPT_KEY)
    _, at = _count_after(tail, at, _TOTAL_KEY)
    completion, at = _count_after(tail, at, _COMPLETION_KEY)
    if at < 0 or tail[at : at + 1] not in (b",", b"}"):
        return None
    return prompt, completion


def _count_after(data: bytes, start: int, key: bytes) -> tuple[int, int]:
    """The count written after `key` at `start` in `data`, and where it ends; (0, -1) when
    `start` is -1, or `key` is not there or not followed by a count of at most
    `_MAX_DIGITS` digits."""
    if start < 0 or data[start : start + len(key)] != key:
        return 0, -1
    value = 0
    first = at = start + len(key)
    end = min(len(data), first + _MAX_DIGITS + 1)
    while at < end:
        digit = data[at] - 48  # b"0"
        if not 0 <= digit <= 9:
            break
        value = value * 10 + digit
        at += 1
    if at == first or at - first > _MAX_DIGITS:
        return 0, -1
    return value, at


def _parsed_usage(tail: bytes, start: int) -> tuple[int | None, int | None] | None:
    """The numbers of the JSON object at `start`, if it is a usage that has either."""
    text = tail[start : start + _USAGE_SPAN].decode("utf-8", "replace")
    try:
        usage, _ = _DECODER.raw_decode(text)
    except ValueError:
        return None
    if not isinstance(usage, dict):
        return None
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    return None if prompt is None and completion is None else (prompt, completion)


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _after_boundary(data: bytes, start: int, end: int) -> int:
    """Just past the last blank line in `data[start:end]` (LF or CRLF lines), else `start`.

    One search when the last line break closes a blank line, as between one-line events
    (vLLM's): a search is a method call, and a blank line's last byte is a line break."""
    nl = data.rfind(b"\n", start, end)
    if nl < 0:
        return start
    if nl > start and data[nl - 1] == _LF:
        return nl + 1
    if nl > start + 1 and data[nl - 1] == _CR and data[nl - 2] == _LF:
        return nl + 1
    lf = data.rfind(b"\n\n", start, end)
    crlf = data.rfind(b"\n\r\n", max(start, lf), end)
    if crlf >= 0:
        return crlf + 3
    return lf + 2 if lf >= 0 else start


def _next_boundary(data: bytes, start: int) -> int:
    """Just past the first blank line from `start` to end, else the end of `data`; one
    search when the first line break closes a blank line (as `_after_boundary`)."""
    nl = data.find(b"\n", start)
    return len(data) if nl < 0 else _boundary_from(data, nl)


def _boundary_from(data: bytes, nl: int) -> int:
    """Just past the first blank line that the line break at `nl` closes or opens, else the
    end of `data` (`_next_boundary` past its search)."""
    if nl + 1 < len(data) and data[nl + 1] == _LF:
        return nl + 2
    if nl + 2 < len(data) and data[nl + 1] == _CR and data[nl + 2] == _LF:
        return nl + 3
    lf = data.find(b"\n\n", nl)
    crlf = data.find(b"\n\r\n", nl, lf + 1 if lf >= 0 else len(data))
    if crlf >= 0:
        return crlf + 3
    return lf + 2 if lf >= 0 else len(data)
