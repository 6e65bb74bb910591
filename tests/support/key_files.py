"""Key files as an operator rewrites them, and the header a client presents its key in."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["bearer", "replace_file"]


def bearer(key: str | bytes, scheme: bytes = b"Bearer ") -> list[tuple[bytes, bytes]]:
    """The head of a request bearing `key`, as the `openai` SDK sends it."""
    raw = key.encode() if isinstance(key, str) else key
    return [(b"content-type", b"application/json"), (b"authorization", scheme + raw)]


def replace_file(path: Path, text: str) -> None:
    """As an operator should: a new file renamed over the old one."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    os.replace(fresh, path)
