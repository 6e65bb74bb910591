"""RESP2 on bytes: commands encoded as Redis reads them, replies parsed however the stream splits.

The client's behaviour against sockets (timeouts, back-off, a Redis that stops)
is in tests/process/test_resp.py.
"""

from __future__ import annotations

import hashlib

import pytest

from headcount.flow.resp import Reply, RespError, RespParser, RespProtocolError, Script, encode

__all__: list[str] = []

STREAM = (
    b"+OK\r\n"
    b":-12\r\n"
    b":10000000000\r\n"
    b"$5\r\nhe\r\nl\r\n"
    b"$0\r\n\r\n"
    b"$-1\r\n"
    b"*-1\r\n"
    b"*0\r\n"
    b"-NOSCRIPT No matching script.\r\n"
    b"*3\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n-ERR inner\r\n"
)


def expected() -> list[object]:
    return [
        b"OK",
        -12,
        10_000_000_000,
        b"he\r\nl",
        b"",
        None,
        None,
        [],
        "NOSCRIPT No matching script.",
        [b"a", [1, None], "ERR inner"],
    ]


def comparable(reply: Reply) -> object:
    """Errors compared by their message."""
    if isinstance(reply, RespError):
        return str(reply)
    if isinstance(reply, list):
        return [comparable(item) for item in reply]
    return reply


def test_encode_is_an_array_of_bulk_strings() -> None:
    assert encode(b"EVALSHA", "ab", 1, 2.5) == (
        b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$3\r\n2.5\r\n"
    )


def test_every_kind_of_reply_in_one_read() -> None:
    replies = RespParser().feed(STREAM)
    assert [comparable(r) for r in replies] == expected()
    assert isinstance(replies[8], RespError)


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_replies_split_anywhere_come_out_whole_and_in_order(size: int) -> None:
    parser = RespParser()
    replies: list[Reply] = []
    for start in range(0, len(STREAM), size):
        replies += parser.feed(STREAM[start : start + size])
    assert [comparable(r) for r in replies] == expected()


def test_a_partial_reply_waits_for_the_rest() -> None:
    parser = RespParser()
    assert parser.feed(b"*2\r\n$3\r\nabc\r\n") == []
    assert parser.feed(b":4") == []
    assert parser.feed(b"\r\n+OK\r\n") == [[b"abc", 4], b"OK"]


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 400 Bad Request\r\n",
        b":12a\r\n",
        b"$-2\r\n",
        b"$3\r\nabcd\r\n",
        b"*x\r\n",
    ],
)
def test_what_is_not_resp_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(RespProtocolError):
        RespParser().feed(data)


def test_a_reply_larger_than_the_bound_is_refused_before_it_is_whole() -> None:
    parser = RespParser(max_reply=64)
    assert parser.feed(b"+" + b"x" * 60) == []
    with pytest.raises(RespProtocolError, match="larger than 64"):
        parser.feed(b"x" * 10)
    with pytest.raises(RespProtocolError, match="length"):
        RespParser(max_reply=64).feed(b"$65\r\n")


def test_a_script_is_named_by_its_sha1() -> None:
    assert Script("return 1").sha == hashlib.sha1(b"return 1").hexdigest()
