"""What crosses the proxy between client and engine: hop-by-hop headers never do, in either
direction, whichever `Connection` line names them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from headcount.proxy.headers import forward_headers, response_headers

_NAME = st.text(alphabet="abcdefgh-", min_size=1, max_size=6).map(lambda n: b"x-" + n.encode())


def rendered_names(block: bytes) -> set[bytes]:
    return {line.split(b":", 1)[0] for line in block.split(b"\r\n") if b":" in line}


@given(
    named=st.lists(st.lists(_NAME, min_size=1, max_size=3), min_size=1, max_size=4),
    kept=st.lists(_NAME, max_size=4),
)
def test_a_header_named_in_any_connection_line_is_dropped_both_ways(
    named: list[list[bytes]], kept: list[bytes]
) -> None:
    # Only the last of two `Connection` lines used to count: what the first named went through.
    listed = {name for line in named for name in line}
    headers = [(b"connection", b", ".join([b"keep-alive", *line])) for line in named]
    headers += [(name, b"v") for name in sorted(listed | set(kept))]
    expected = set(kept) - listed
    upstream, _ = forward_headers(headers, 0)
    downstream = response_headers(headers, b"id")
    assert rendered_names(upstream) - {b"content-length"} == expected
    assert rendered_names(downstream) - {b"x-request-id"} == expected


def test_connection_tokens_are_matched_whatever_their_case_and_spacing() -> None:
    headers = [
        (b"connection", b"close"),
        (b"connection", b" X-One ,x-TWO"),
        (b"x-one", b"1"),
        (b"x-two", b"2"),
        (b"x-three", b"3"),
    ]
    upstream, _ = forward_headers(headers, 0)
    assert rendered_names(upstream) == {b"x-three", b"content-length"}
