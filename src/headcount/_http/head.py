"""A message head as httptools hands it over, counted one way for requests and responses.

Both sides of the router read heads from peers that may send too much: a client's
request head is bounded by `max_header_size` (431), an engine's response head by
`max_head_size` (a `ProtocolViolation`). Each header counts as it arrives (its name,
its value, and 4 bytes for ": " and CRLF), and so does the request target or the
status reason. httptools joins a header line split over reads before it calls back,
so the callbacks cannot see what it holds meanwhile: that is bounded apart, from the
raw bytes of reads that end inside a head, at twice the limit (`_count_raw`).

The header callback is written once, in `HeadReader`, the base of both connection
protocols: httptools binds its callbacks once per parser, so sharing it costs no call
per header. Each side names the other headers it acts on (`noted`) and hears of them
through `_note`; Content-Length both sides act on, so it is read here.
"""

from __future__ import annotations

import asyncio
import types
from abc import ABCMeta, abstractmethod
from typing import Any, Generic, NoReturn, TypeVar

__all__ = ["Head", "HeadReader"]


class Head:
    """One message's head as read so far: a fresh one per message, never reset.

    A subclass sets every field in its own `__init__`: one is made per message, and a
    call to a base `__init__` would cost each message a call.
    """

    __slots__ = ("content_length", "headers", "raw", "size")

    headers: list[tuple[bytes, bytes]]
    """Names lowercased, values as sent, in order."""
    content_length: int | None
    size: int
    """Bytes the callbacks delivered: what the limit is counted in."""
    raw: int
    """Bytes of the reads that ended inside this head: what httptools may hold unseen."""


_M = TypeVar("_M", bound=Head)


_SHARED = ("on_header", "_count_head", "_count_raw")
"""The methods every subclass gets a code object of its own for (`__init_subclass__`)."""


def _own_copy(function: Any) -> Any:
    """`function` with a code object of its own. CPython specialises a code object's attribute
    reads for the types it meets; one code object read on requests and responses alike keeps
    missing those caches (measured: thousands of instructions per proxied request). Only
    for the Python sources: compiled by mypyc, the methods are C, with no such cache."""
    return types.FunctionType(
        function.__code__.replace(),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )


class HeadReader(asyncio.Protocol, Generic[_M], metaclass=ABCMeta):
    """The head callbacks and their accounting; `_message` is the message being read.

    Written once, run as each subclass's own copy (`_own_copy`)."""

    __slots__ = ("_max_head_size", "_message", "_noted")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _SHARED:
            shared = vars(HeadReader)[name]
            if name not in vars(cls) and isinstance(shared, types.FunctionType):
                setattr(cls, name, _own_copy(shared))

    def __init__(self, message: _M, max_head_size: int, noted: tuple[bytes, ...]) -> None:
        """`noted`: lowercased header names, besides Content-Length, that go to `_note` (a
        tuple: for a name or two, comparing is cheaper than hashing every header name)."""
        self._message = message
        self._max_head_size = max_head_size
        self._noted = noted

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self._message
        name = name.lower()
        message.headers.append((name, value))
        size = message.size + len(name) + len(value) + 4
        message.size = size
        if size > self._max_head_size:
            self._head_too_large()
        if name == b"content-length":
            message.content_length = int(value)
        elif name in self._noted:
            self._note(name, value)

    def _count_head(self, size: int) -> None:
        """Count the part of the head's first line a callback delivered."""
        message = self._message
        message.size += size
        if message.size > self._max_head_size:
            self._head_too_large()

    def _count_raw(self, size: int) -> bool:
        """Count `size` bytes of a read that ended inside the head; whether that is too many."""
        message = self._message
        message.raw += size
        return message.raw > 2 * self._max_head_size

    @abstractmethod
    def _note(self, name: bytes, value: bytes) -> None:
        """A header named in `noted` arrived (already counted and kept)."""

    @abstractmethod
    def _head_too_large(self) -> NoReturn:
        """Stop parsing: the head is over the limit."""
