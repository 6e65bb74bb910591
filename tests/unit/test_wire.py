"""A chunk's framing (RFC 9112 §7.1) for every size, the table's and beyond it."""

from hypothesis import example, given
from hypothesis import strategies as st

from headcount._http.wire import chunk


@given(size=st.integers(min_value=1, max_value=70_000), last=st.booleans())
@example(size=1, last=False)
@example(size=4095, last=False)
@example(size=4096, last=True)
def test_a_chunk_is_its_size_in_hex_its_bytes_and_the_end_when_last(size: int, last: bool) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    framed = chunk(body, last)
    line, _, rest = framed.partition(b"\r\n")
    assert int(line, 16) == size
    assert rest[:size] == body
    assert rest[size:] == (b"\r\n0\r\n\r\n" if last else b"\r\n")
