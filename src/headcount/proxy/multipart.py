"""The `model` field of a `multipart/form-data` body (the audio endpoints' uploads).

`POST /v1/audio/transcriptions` and `/translations` carry the audio file and
the other parameters as form fields; routing needs only `model`. The body is
already buffered whole by the proxy, so this is a search over bytes, bounded:
at most `MAX_PARTS` part heads are looked at (each under `MAX_HEAD` bytes), a
file part's content is skipped by the search for the next boundary (C speed,
never copied), and the value is at most `MAX_MODEL` bytes. No parsing library,
no temporary files: the body is forwarded byte for byte.

`form_model` returns the model or one of the codes `NOT_A_FORM` (no
`multipart/form-data` content type with a boundary), `MISSING_MODEL` (no
`model` field among the parts looked at, or an empty one), which admission
answers with 400 in OpenAI's shape (`PROBLEMS` has their messages).
"""

from __future__ import annotations

__all__ = [
    "MAX_HEAD",
    "MAX_MODEL",
    "MAX_PARTS",
    "MISSING_MODEL",
    "NOT_A_FORM",
    "PROBLEMS",
    "form_model",
]

NOT_A_FORM = "not_a_form"
MISSING_MODEL = "missing_model"
MAX_PARTS = 64
"""Parts looked at for `model`: real uploads have a handful of fields."""
MAX_HEAD = 4096
"""Bytes of one part's header block."""
MAX_MODEL = 1024
"""Bytes of the `model` value."""
PROBLEMS = {
    NOT_A_FORM: "request body must be multipart/form-data (with a boundary)",
    MISSING_MODEL: "request form must have a `model` field",
}
"""The message of each code (400 answers)."""


def _boundary(content_type: bytes) -> bytes | None:
    """The boundary of a `multipart/form-data` content type, unquoted."""
    kind, _, params = content_type.partition(b";")
    if kind.strip().lower() != b"multipart/form-data":
        return None
    for param in params.split(b";"):
        name, _, value = param.strip().partition(b"=")
        if name.strip().lower() == b"boundary":
            value = value.strip()
            if len(value) >= 2 and value[:1] == value[-1:] == b'"':
                value = value[1:-1]
            return value if 0 < len(value) <= 200 else None
    return None


def _field_name(head: bytes) -> bytes | None:
    """The `name` of a part's `Content-Disposition: form-data` header."""
    for line in head.split(b"\r\n"):
        header, _, value = line.partition(b":")
        if header.strip().lower() != b"content-disposition":
            continue
        for param in value.split(b";")[1:]:
            name, _, quoted = param.strip().partition(b"=")
            if name.strip().lower() == b"name":
                quoted = quoted.strip()
                if len(quoted) >= 2 and quoted[:1] == quoted[-1:] == b'"':
                    quoted = quoted[1:-1]
                return quoted
    return None


def form_model(content_type: bytes | None, body: bytes) -> str:
    """The `model` form field of `body`, or `NOT_A_FORM` / `MISSING_MODEL`."""
    boundary = None if content_type is None else _boundary(content_type)
    if boundary is None:
        return NOT_A_FORM
    delimiter = b"--" + boundary
    position = body.find(delimiter)
    for _ in range(MAX_PARTS):
        if position < 0:
            return MISSING_MODEL
        start = position + len(delimiter)
        if body[start : start + 2] != b"\r\n":  # `--` after the last part, or garbage
            return MISSING_MODEL
        start += 2
        head_end = body.find(b"\r\n\r\n", start, start + MAX_HEAD)
        if head_end < 0:
            return MISSING_MODEL
        content = head_end + 4
        position = body.find(b"\r\n" + delimiter, content)
        if _field_name(body[start:head_end]) == b"model":
            if position < 0 or position - content > MAX_MODEL:
                return MISSING_MODEL
            value = body[content:position].strip()
            try:
                model = value.decode()
            except UnicodeDecodeError:
                return MISSING_MODEL
            return model or MISSING_MODEL
        if position >= 0:
            position += 2
    return MISSING_MODEL
