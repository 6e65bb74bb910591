"""Reading an engine's `/v1/models` answer as it streams in, keeping only what the router uses.

`json.loads` on an engine's whole answer holds the event loop for the whole
parse (seconds for a listing of 200,000 adapters), escapes as `RecursionError`
on deep nesting, and keeps whatever nested data the engine put in a card for
`/v1/models` to serve back. `ModelListParser` takes the answer in pieces as
they arrive and does work in proportion to each piece, so the prober, which
feeds it a few KiB at a time and yields in between, never stalls the loop.

It keeps at most `max_models` cards (then it is `full`: the rest need not be
read), each reduced to `KEPT_FIELDS` where they hold a JSON scalar (strings
that UTF-8 can carry, finite numbers), and only cards whose `id` is a string.
An answer that is not JSON (RFC 8259, in UTF-8), nests deeper than
`MAX_DEPTH`, holds a string or number over `MAX_TOKEN` bytes, ends early, or
is not an OpenAI model list is rejected with a `ModelListError` saying how.
Where an answer is split into pieces never changes the outcome.

Common cards (scalars, and vLLM's `permission` list of flat objects) are each
matched whole by one linear-time regular expression and decoded by the C JSON
decoder; everything else goes token by token through a small state machine.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from typing import Final

__all__ = [
    "KEPT_FIELDS",
    "MAX_DEPTH",
    "MAX_TOKEN",
    "Card",
    "ModelListError",
    "ModelListParser",
]

Scalar = str | int | float | bool | None
Card = dict[str, Scalar]

KEPT_FIELDS: Final = ("id", "object", "owned_by", "root", "parent", "max_model_len")
"""What the router reads (`id`, `parent`) and serves back in its own `/v1/models`. Not
`created`: vLLM stamps it at each request, so keeping it would make every probe a change of
the engine (and a rebuilt fleet snapshot); the router's `/v1/models` gives its own."""
MAX_DEPTH: Final = 32
"""Containers nested in each other; vLLM's answer nests 5 deep."""
MAX_TOKEN: Final = 64 * 1024
"""Bytes in one string or number; model ids and paths are far shorter."""

_FAST_CARD_MAX = 16 * 1024
"""Longest card tried whole by `_CARD`; a longer one goes token by token."""


class ModelListError(ValueError):
    """The answer is unusable as a model list; the message says why."""


# ------------------------------------------------------------------ tokens
_TOP_ROLE, _DATA_ROLE, _CARD_ROLE, _SKIP_ROLE = range(4)
_WS = re.compile(rb"[ \t\n\r]*+")
_PUNCT, _STRING, _NUMBER, _LITERAL = 1, 2, 3, 4
_TOKEN = re.compile(
    rb"([{}\[\]:,])"
    rb'|("(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+")'
    rb"|(-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][-+]?+[0-9]++)?+)"
    rb"|(true|false|null)"
)
_STRING_PREFIX = re.compile(
    rb'"(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+(?:\\(?:u[0-9a-fA-F]{0,3})?)?'
)
_NUMBER_PREFIX = re.compile(rb"-?+(?:0|[1-9][0-9]*+)(?:\.[0-9]*+)?+(?:[eE][-+]?+[0-9]*+)?+")
"""A number, or the start of a longer one: a number that fills the rest of a piece like this
may go on in the next."""
_TOKEN_PREFIXES = frozenset(
    {b"-"} | {word[:i] for word in (b"true", b"false", b"null") for i in range(1, len(word))}
)
_LITERALS: dict[bytes, Scalar] = {b"true": True, b"false": False, b"null": None}
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY = b"{}[]"
_COMMA, _COLON = b",:"


def _card_pattern(levels: int) -> re.Pattern[bytes]:
    """An object whose values nest at most `levels` deep; lax about commas (the C decoder is
    strict), possessive throughout so that it never backtracks: linear in what it reads."""
    ws = rb"[ \t\n\r]*+"
    string = rb'"(?:[^"\\\x00-\x1f]++|\\.)*+"'
    scalar = rb"(?:" + string + rb"|-?[0-9][0-9.eE+-]*+|true|false|null)"

    def array(inner: bytes) -> bytes:
        return rb"\[" + ws + rb"(?:" + inner + ws + rb",?+" + ws + rb")*+\]"

    def obj(inner: bytes) -> bytes:
        member = string + ws + rb":" + ws + inner + ws + rb",?+" + ws
        return rb"\{" + ws + rb"(?:" + member + rb")*+\}"

    value = scalar
    for _ in range(levels):
        value = rb"(?:" + scalar + rb"|" + array(value) + rb"|" + obj(value) + rb")"
    return re.compile(obj(value))


_CARD = _card_pattern(3)
_STRING_SCANNER = json.decoder.scanstring  # type: ignore[attr-defined]

# Runs: what a container holds that the router does not keep, skipped in one C call each. Strict
# JSON, strings and numbers short enough that MAX_TOKEN cannot be at stake (longer ones, and
# values nested deeper than _RUN_LEVELS, are left to the tokens), possessive: linear.
_RUN_LEVELS = 4
_RUN_WS = rb"[ \t\n\r]*+"
_RUN_STRING = rb'"(?:[^"\\\x00-\x1f]{1,1000}+|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,64}+"'
_RUN_SCALAR = (
    rb"(?:" + _RUN_STRING + rb"|-?+(?:0|[1-9][0-9]{0,999}+)(?:\.[0-9]{1,1000}+)?+"
    rb"(?:[eE][-+]?+[0-9]{1,1000}+)?+|true|false|null)"
)


def _members(member: bytes, close: bytes) -> bytes:
    """`member`s separated by commas (none trailing), then `close`."""
    ws = _RUN_WS
    after = b"(?:,(?!" + ws + close + b")" + ws + b"|(?=" + close + b"))"
    return b"(?:" + member + ws + after + b")*+" + close


def _run_value(levels: int, outer_key: bytes = _RUN_STRING) -> bytes:
    """A value nested at most `levels` deep; keys of its outermost object match `outer_key`."""
    value = _RUN_SCALAR
    for level in range(levels):
        key = outer_key if level == levels - 1 else _RUN_STRING
        array = rb"\[" + _RUN_WS + _members(value, rb"\]")
        pair = key + _RUN_WS + b":" + _RUN_WS + value
        value = (
            b"(?:" + _RUN_SCALAR + b"|" + array + rb"|\{" + _RUN_WS + _members(pair, rb"\}") + b")"
        )
    return value


def _run(member: bytes, close: bytes) -> re.Pattern[bytes]:
    """Members each followed by a comma, then maybe a last one before `close` (group 1)."""
    ws = _RUN_WS
    return re.compile(
        b"(?:"
        + member
        + ws
        + b","
        + ws
        + b")*+(?:("
        + member
        + b")"
        + ws
        + b"(?="
        + close
        + b"))?+"
    )


def _pair(key: bytes) -> bytes:
    return key + _RUN_WS + b":" + _RUN_WS + _run_value(_RUN_LEVELS)


def _key_other_than(*names: str) -> bytes:
    """A key spelled without escapes that is none of `names`."""
    return rb'"(?!(?:%s)")[^"\\\x00-\x1f]{0,1000}+"' % "|".join(names).encode()


_RUNS = {  # (role, is_object) -> run
    (_SKIP_ROLE, False): _run(_run_value(_RUN_LEVELS), rb"\]"),
    (_SKIP_ROLE, True): _run(_pair(_RUN_STRING), rb"\}"),
    (_DATA_ROLE, False): _run(_run_value(_RUN_LEVELS, _key_other_than("id")), rb"\]"),
    (_CARD_ROLE, True): _run(_pair(_key_other_than(*KEPT_FIELDS)), rb"\}"),
    (_TOP_ROLE, True): _run(_pair(_key_other_than("data")), rb"\}"),
}

# ------------------------------------------------------------------ grammar
_KEY_OR_END, _KEY, _COLON_NEXT, _VALUE, _COMMA_OR_END, _VALUE_OR_END = range(6)
_OBJECT_MEMBER = frozenset({_KEY_OR_END, _KEY})
_ARRAY_MEMBER = frozenset({_VALUE_OR_END, _VALUE})
"""Where a container's next member may start: an object's key, an array's value."""
_START, _INSIDE, _END = range(3)
_MISSING, _LIST, _NOT_LIST = range(3)
_DROP = object()
_KEPT = frozenset(KEPT_FIELDS)


class _Frame:
    """One open container: what it is, where the grammar stands in it, what it is for."""

    __slots__ = ("card", "is_object", "key", "role", "state")

    def __init__(self, is_object: bool, role: int) -> None:
        self.is_object = is_object
        self.role = role
        self.state = _KEY_OR_END if is_object else _VALUE_OR_END
        self.key: str | None = None
        self.card: Card = {}


def _kept(value: object) -> object:
    """`value` if a card may keep it, else `_DROP`: scalars only, strings UTF-8 can encode
    (no lone surrogate), finite numbers."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _DROP
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return _DROP
        return value
    return _DROP


def _scalar(kind: int, token: bytes) -> object:
    if kind == _STRING:
        text: str = _STRING_SCANNER(token.decode(), 1)[0]
        return _kept(text)
    if kind == _NUMBER:
        try:
            number = float(token) if any(c in token for c in b".eE") else int(token)
        except ValueError:  # more digits than int() converts
            return _DROP
        return _kept(number)
    return _LITERALS[token]


class ModelListParser:
    """Feed it an answer's bytes in pieces, then `close()` for the cards (or `ModelListError`)."""

    def __init__(self, max_models: int) -> None:
        self._max_models = max_models
        self._cards: list[Card] = []
        self._stack: list[_Frame] = []
        self._state = _START
        self._data = _MISSING
        self._pending = bytearray()
        """Bytes not parsed yet: an unfinished token and what came after it."""
        self._stalled = 0
        """How many bytes were pending after the last scan; with tiny pieces, scanning again
        waits until twice as many are, so a long token is not rescanned once per piece."""
        self._offset = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self.full = False
        """`max_models` cards kept: what follows is ignored and need not be read."""

    def feed(self, data: bytes) -> None:
        if self.full:
            return
        try:
            self._utf8.decode(data)
        except UnicodeDecodeError:
            raise ModelListError("not UTF-8") from None
        pending = self._pending
        pending += data
        if len(pending) < 2 * self._stalled:
            return  # a token is unfinished: read on until what is held has doubled
        pos = self._scan(bytes(pending), eof=False)
        self._offset += pos
        del pending[:pos]
        self._stalled = len(pending)
        if self._stalled > MAX_TOKEN:
            raise ModelListError(f"a JSON string or number over {MAX_TOKEN} bytes")

    def close(self) -> tuple[Card, ...]:
        """The cards kept, once the whole answer has been fed."""
        if not self.full:
            try:
                self._utf8.decode(b"", final=True)
            except UnicodeDecodeError:
                raise ModelListError("not UTF-8") from None
            self._scan(bytes(self._pending), eof=True)
            self._pending.clear()
        if not self.full:
            if self._state != _END:
                raise ModelListError("empty answer" if self._state == _START else "truncated")
            if self._data != _LIST:
                raise ModelListError("not an OpenAI model list")
        if not self._cards:
            raise ModelListError("lists no model")
        return tuple(self._cards)

    # -- scanning ---------------------------------------------------------------------------

    def _scan(self, buf: bytes, *, eof: bool) -> int:
        """Consume every whole token of `buf`; returns where an unfinished one starts."""
        end = len(buf)
        pos = 0
        while True:
            pos = _WS.match(buf, pos).end()  # type: ignore[union-attr]
            if pos >= end or self.full:
                return end
            if self._stack and (skipped := self._skip(buf, pos, end)):
                pos = skipped
                continue
            match = _TOKEN.match(buf, pos)
            if match is None:
                if not self._unfinished(buf, pos):
                    raise self._invalid(pos)
                if eof:
                    raise ModelListError("truncated")
                return pos
            token_end = match.end()
            if token_end - pos > MAX_TOKEN:
                raise ModelListError(f"a JSON string or number over {MAX_TOKEN} bytes")
            kind = match.lastindex or 0
            if kind == _NUMBER and not eof and _NUMBER_PREFIX.fullmatch(buf, pos):
                return pos  # the number may go on in the next piece
            self._token(kind, buf, pos, token_end)
            pos = token_end

    def _skip(self, buf: bytes, pos: int, end: int) -> int:
        """Where what follows `pos` in the innermost container ends if it can be taken whole (a
        run of members the router does not keep, or a card), else 0 (left to the tokens)."""
        stack = self._stack
        frame = stack[-1]
        if frame.state not in (_OBJECT_MEMBER if frame.is_object else _ARRAY_MEMBER):
            return 0
        if len(stack) + _RUN_LEVELS <= MAX_DEPTH:
            match = _RUNS[frame.role, frame.is_object].match(buf, pos)
            if match is not None and match.end() > pos:
                if match.group(1) is not None:
                    frame.state = _COMMA_OR_END
                else:
                    frame.state = _KEY if frame.is_object else _VALUE
                return match.end()
        if frame.role == _DATA_ROLE and buf[pos] == _OPEN_OBJECT:
            card_end = self._fast_card(buf, pos, end)
            if card_end:
                frame.state = _COMMA_OR_END
            return card_end
        return 0

    def _unfinished(self, buf: bytes, pos: int) -> bool:
        if buf[pos] == ord('"'):
            return _STRING_PREFIX.fullmatch(buf, pos) is not None
        return len(buf) - pos < 5 and buf[pos:] in _TOKEN_PREFIXES

    def _invalid(self, pos: int) -> ModelListError:
        return ModelListError(f"not JSON (byte {self._offset + pos})")

    def _fast_card(self, buf: bytes, pos: int, end: int) -> int:
        """Where the card at `pos` ends if it was read whole, else 0 (left to the tokens)."""
        match = _CARD.match(buf, pos, min(end, pos + _FAST_CARD_MAX))
        if match is None:
            return 0
        try:
            decoded = json.loads(buf[pos : match.end()])
        except (ValueError, RecursionError):
            return 0
        card: Card = {}
        for name in KEPT_FIELDS:
            if name in decoded and (value := _kept(decoded[name])) is not _DROP:
                card[name] = value  # type: ignore[assignment]
        self._add_card(card)
        return match.end()

    # -- grammar ----------------------------------------------------------------------------

    def _token(self, kind: int, buf: bytes, start: int, end: int) -> None:
        if not self._stack:
            if self._state == _START and kind == _PUNCT and buf[start] == _OPEN_OBJECT:
                self._state = _INSIDE
                self._push(True, _TOP_ROLE)
                return
            if self._state == _START:
                raise ModelListError("not an OpenAI model list")
            raise ModelListError(f"more after the model list (byte {self._offset + start})")
        frame = self._stack[-1]
        char = buf[start] if kind == _PUNCT else -1
        state = frame.state
        if state in (_VALUE, _VALUE_OR_END):
            if char == _CLOSE_ARRAY and state == _VALUE_OR_END:
                self._pop()
                return
            frame.state = _COMMA_OR_END
            self._value(frame, kind, char, buf, start, end)
        elif state == _COMMA_OR_END:
            if char == _COMMA:
                frame.state = _KEY if frame.is_object else _VALUE
            elif char == (_CLOSE_OBJECT if frame.is_object else _CLOSE_ARRAY):
                self._pop()
            else:
                raise self._invalid(start)
        elif state == _COLON_NEXT:
            if char != _COLON:
                raise self._invalid(start)
            frame.state = _VALUE
        elif kind == _STRING:  # _KEY or _KEY_OR_END
            frame.key = None
            if frame.role in (_TOP_ROLE, _CARD_ROLE):
                key: str = _STRING_SCANNER(buf[start:end].decode(), 1)[0]
                wanted = key == "data" if frame.role == _TOP_ROLE else key in _KEPT
                frame.key = key if wanted else None
            frame.state = _COLON_NEXT
        elif char == _CLOSE_OBJECT and state == _KEY_OR_END:
            self._pop()
        else:
            raise self._invalid(start)

    def _value(
        self, parent: _Frame, kind: int, char: int, buf: bytes, start: int, end: int
    ) -> None:
        key = parent.key
        if kind == _PUNCT:
            if char != _OPEN_OBJECT and char != _OPEN_ARRAY:
                raise self._invalid(start)
            is_object = char == _OPEN_OBJECT
            role = _SKIP_ROLE
            if parent.role == _TOP_ROLE and key is not None:
                self._cards.clear()  # of two "data" keys the last one counts, as in JSON
                self._data = _NOT_LIST if is_object else _LIST
                role = _SKIP_ROLE if is_object else _DATA_ROLE
            elif parent.role == _DATA_ROLE and is_object:
                role = _CARD_ROLE
            elif parent.role == _CARD_ROLE and key is not None:
                parent.card.pop(key, None)
            self._push(is_object, role)
            return
        if parent.role == _CARD_ROLE and key is not None:
            value = _scalar(kind, buf[start:end])
            if value is _DROP:
                parent.card.pop(key, None)
            else:
                parent.card[key] = value  # type: ignore[assignment]
        elif parent.role == _TOP_ROLE and key is not None:
            self._cards.clear()
            self._data = _NOT_LIST

    def _push(self, is_object: bool, role: int) -> None:
        if len(self._stack) >= MAX_DEPTH:
            raise ModelListError(f"nested deeper than {MAX_DEPTH} levels")
        self._stack.append(_Frame(is_object, role))

    def _pop(self) -> None:
        frame = self._stack.pop()
        if frame.role == _CARD_ROLE:
            card = frame.card
            self._add_card({name: card[name] for name in KEPT_FIELDS if name in card})
        if not self._stack:
            self._state = _END

    def _add_card(self, card: Card) -> None:
        if isinstance(card.get("id"), str):
            self._cards.append(card)
            if len(self._cards) >= self._max_models:
                self.full = True
