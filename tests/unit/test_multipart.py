"""The `model` field of an audio upload's form: found wherever it is, bounded, refused clearly."""

from __future__ import annotations

from headcount.proxy.multipart import MAX_PARTS, MISSING_MODEL, NOT_A_FORM, form_model

__all__: list[str] = []

_TYPE = b"multipart/form-data; boundary=XyZ"


def _part(name: str, value: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"'
    if filename is not None:
        disposition += f'; filename="{filename}"'
    head = f"Content-Disposition: {disposition}\r\n"
    if filename is not None:
        head += "Content-Type: audio/wav\r\n"
    return b"--XyZ\r\n" + head.encode() + b"\r\n" + value + b"\r\n"


def _form(*parts: bytes) -> bytes:
    return b"".join(parts) + b"--XyZ--\r\n"


def test_the_model_is_read_before_or_after_the_file() -> None:
    audio = b"RIFF" + bytes(range(256)) * 50 + b"\r\n--Xy"  # near-boundaries inside the file
    assert form_model(_TYPE, _form(_part("model", b"whisper"), _part("file", audio, "a"))) == (
        "whisper"
    )
    assert form_model(_TYPE, _form(_part("file", audio, "a.wav"), _part("model", b"w/v3"))) == (
        "w/v3"
    )


def test_boundary_and_header_spellings_vllm_clients_send() -> None:
    quoted = b'Multipart/Form-Data; charset=utf-8; boundary="XyZ"'
    body = b"--XyZ\r\ncontent-disposition: form-data; name=model\r\n\r\nm1\r\n--XyZ--\r\n"
    assert form_model(quoted, body) == "m1"


def test_no_form_or_no_model_is_said_so() -> None:
    assert form_model(None, b"{}") == NOT_A_FORM
    assert form_model(b"application/json", b'{"model": "m"}') == NOT_A_FORM
    assert form_model(b"multipart/form-data", b"") == NOT_A_FORM  # no boundary
    assert form_model(_TYPE, _form(_part("file", b"x", "a"))) == MISSING_MODEL
    assert form_model(_TYPE, _form(_part("model", b""))) == MISSING_MODEL
    assert form_model(_TYPE, b"--XyZ\r\nContent-Disposition: form-data; name=model") == (
        MISSING_MODEL
    )


def test_the_parts_looked_at_are_bounded() -> None:
    many = [_part(f"f{index}", b"v") for index in range(MAX_PARTS)]
    assert form_model(_TYPE, _form(*many, _part("model", b"m"))) == MISSING_MODEL
    assert form_model(_TYPE, _form(*many[:-1], _part("model", b"m"))) == "m"
