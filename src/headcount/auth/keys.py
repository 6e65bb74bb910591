"""API keys as the router holds them: SHA-256 digests, never the keys, a key checked by its digest.

A client key file holds one key per line, in clear or as `sha256:<64 hex>` (so
the file itself need not hold a secret), with blank lines and `#` comments;
either way only the digest is kept (`digest.py`, shared with the tenants file).
`ApiKeys.tenant` reads the one `Authorization: Bearer <key>` header (what
OpenAI's and vLLM's clients send; no other header, no query string), hashes
the key once and looks the digest up in a dict of the keys' tenants: one
lookup whatever the number of keys (comparing with every digest
in constant time grows with the number of keys: bench/RESULTS.md). A lookup's time can only
say something of the digest's hash-table bucket, under a per-process random
seed, never of the key: finding a key from its SHA-256 is a preimage attack,
however much of the digest a client learnt. Two `Authorization` headers are
refused: which of them a later hop would read is anyone's guess.

A keep-alive client sends its key with every request: the connection's note
(`ConnectionNote`) keeps the key these keys last accepted there and its
tenant, and a request bearing the same key (compared in constant time) is
not hashed again. The note holds what the connection's own headers held, for
the connection's life; keys reloaded are new `ApiKeys`, so a revoked key is
checked, and refused, at its connection's next request.

The engine key file holds one key, sent to engines as `Authorization: Bearer`;
an `EngineKey` keeps it rendered for the wire and never shows it in a repr.
Error messages name line numbers, never a line's content: a message about a
key file must be safe to log.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from hmac import compare_digest
from types import MappingProxyType

from headcount._http.handler import ConnectionNote
from headcount.auth.digest import KeyFileError, check_key, key_digest
from headcount.auth.tenants import DEFAULT_TENANT, Tenant, Tenants

__all__ = [
    "ApiKeys",
    "EngineKey",
    "KeyFileError",
    "bearer_token",
    "parse_api_keys",
    "parse_engine_key",
]

_AUTHORIZATION = b"authorization"
_BEARER = b"bearer "


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The key of the one `Authorization: Bearer <key>` header; None if absent, repeated or
    of another scheme."""
    value: bytes | None = None
    for name, field in headers:
        if name == _AUTHORIZATION:
            if value is not None:
                return None
            value = field
    if value is None or value[:7].lower() != _BEARER:
        return None
    return value[7:].strip(b" \t") or None


class ApiKeys:
    """The digests of the keys that may use the data plane, each with its tenant."""

    __slots__ = ("_digests",)

    def __init__(self, tenants: Mapping[bytes, Tenant] | None = None) -> None:
        """A key's SHA-256 digest -> its tenant. None or empty: nothing is admitted."""
        self._digests: dict[bytes, Tenant] = dict(tenants or {})

    @classmethod
    def of_default(cls, digests: Iterable[bytes]) -> ApiKeys:
        """Keys that name no tenant (`--api-keys-file`'s): each is the `default` tenant's."""
        return cls(dict.fromkeys(digests, Tenant(DEFAULT_TENANT)))

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self._digests)} keys)"

    def merged(self, tenants: Tenants) -> ApiKeys:
        """These keys as the tenants file's default tenant's, beside the file's own keys; a
        key in both is the tenant's that names it."""
        return ApiKeys({**dict.fromkeys(self._digests, tenants.default), **tenants.by_digest})

    def tenant(
        self, headers: list[tuple[bytes, bytes]], note: ConnectionNote | None = None
    ) -> Tenant | None:
        """The tenant of the request's bearer key, None if it has none of ours: one SHA-256,
        one dict lookup; none when `note`, its connection's, holds the key as these keys
        accepted it."""
        key = bearer_token(headers)
        if key is None:
            return None
        if note is not None and note.owner is self and compare_digest(note.key, key):
            noted = note.value
            if isinstance(noted, Tenant):
                return noted
        tenant = self._digests.get(hashlib.sha256(key).digest())
        if tenant is not None and note is not None:
            note.key, note.owner, note.value = key, self, tenant
        return tenant

    def admits(
        self, headers: list[tuple[bytes, bytes]], note: ConnectionNote | None = None
    ) -> bool:
        """Whether the request's bearer key is one of ours."""
        return self.tenant(headers, note) is not None


class EngineKey:
    """The key engines expect, rendered once for forwarded requests and for probes."""

    __slots__ = ("header_line", "probe_headers")

    def __init__(self, key: str) -> None:
        self.header_line = b"authorization: Bearer %s\r\n" % key.encode("ascii")
        """What a forwarded request carries in place of the client's `Authorization`."""
        self.probe_headers: Mapping[str, str] = MappingProxyType({"Authorization": f"Bearer {key}"})

    def __repr__(self) -> str:
        return "EngineKey(<hidden>)"


def parse_api_keys(text: str) -> ApiKeys:
    """The client keys of a key file's text: one per line, clear or `sha256:<hex>`, `#` comments;
    each is the `default` tenant's."""
    digests: list[bytes] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, *rest = line.split(None, 1)
        where = f"line {number}"
        if rest and not rest[0].startswith("#"):
            raise KeyFileError(f"{where}: one key per line (anything after it must be a # comment)")
        digests.append(key_digest(key, where))
    if not digests:
        # Also what a reader sees of a file being rewritten in place: keep the old keys.
        raise KeyFileError("no key in the file (to revoke every key, stop the router)")
    return ApiKeys.of_default(digests)


def parse_engine_key(text: str) -> EngineKey:
    """The engine key of a key file's text: the whole file, whitespace stripped."""
    key = text.strip()
    if not key:
        raise KeyFileError("the file is empty")
    check_key(key, "the file must hold one key")
    return EngineKey(key)
