"""One client key as a file writes it, to the SHA-256 digest the router keeps instead.

Shared by the two files that list client keys (`--api-keys-file`, one a line,
and `--tenants-file`, TOML lists), so a key reads alike in both: in clear
(printable ASCII without spaces) or as `sha256:<64 hex>`. Below both parsers
and the values they build; `KeyFileError` is the one error either raises, its
message naming where in the file, never what the file holds.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["KeyFileError", "check_key", "key_digest"]

_DIGEST_PREFIX = "sha256:"
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")


class KeyFileError(ValueError):
    """A key file cannot be used; the message names the line, never its content."""


def check_key(key: str, where: str) -> None:
    """Refuse a key that could not travel in an `Authorization` header as written."""
    if not key:
        raise KeyFileError(f"{where}: a key must not be empty")
    if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
        raise KeyFileError(f"{where}: a key must be printable ASCII without spaces")


def key_digest(key: str, where: str) -> bytes:
    """The SHA-256 digest of `key`, written in clear or as `sha256:<64 hex>`; `where` names
    its place in the file in the error."""
    if key.startswith(_DIGEST_PREFIX):
        hexdigest = key[len(_DIGEST_PREFIX) :]
        if _HEX_DIGEST.fullmatch(hexdigest) is None:
            raise KeyFileError(f"{where}: `sha256:` must be followed by 64 hex digits")
        return bytes.fromhex(hexdigest)
    check_key(key, where)
    return hashlib.sha256(key.encode("ascii")).digest()
