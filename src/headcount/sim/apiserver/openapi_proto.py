"""An OpenAPI v2 document in protobuf, the only form kubectl's validation reads.

kubectl decodes ``/openapi/v2`` as gnostic's ``openapi.v2.Document``
(github.com/google/gnostic, OpenAPIv2.proto). The emulator needs only the
part of that schema its own document uses, so it writes the wire format by
hand rather than carry generated code; a key it cannot encode raises instead
of being dropped, so the JSON and protobuf forms cannot drift apart.
"""

from __future__ import annotations

import json
from typing import Any

from headcount.sim.apiserver.objects import JsonObject

__all__ = ["encode_document"]

_LENGTH_DELIMITED = 2
_VARINT = 0


def encode_document(document: JsonObject) -> bytes:
    """``openapi.v2.Document``: swagger (1), info (2), paths (8), definitions (9)."""
    unknown = set(document) - {"swagger", "info", "paths", "definitions"}
    if unknown or document.get("paths"):
        raise ValueError(f"cannot encode {sorted(unknown) or 'paths'} in the protobuf form")
    info = document["info"]
    return b"".join(
        [
            _string(1, document["swagger"]),
            _message(2, _string(1, info["title"]) + _string(2, info["version"])),
            _message(8, b""),
            _message(9, _named_schemas(document["definitions"])),
        ]
    )


def _schema(schema: JsonObject) -> bytes:
    """``openapi.v2.Schema``: the keys the emulator's document uses, by field number."""
    parts: list[bytes] = []
    for key, value in schema.items():
        if key == "$ref":
            parts.append(_string(1, value))
        elif key == "format":
            parts.append(_string(2, value))
        elif key == "additionalProperties":
            item = _message(1, _schema(value)) if isinstance(value, dict) else _bool(2, value)
            parts.append(_message(21, item))
        elif key == "type":
            parts.append(_message(22, _string(1, value)))
        elif key == "items":
            parts.append(_message(23, _message(1, _schema(value))))
        elif key == "properties":
            parts.append(_message(25, _named_schemas(value)))
        elif key.startswith("x-"):
            any_value = _string(2, json.dumps(value))  # JSON is YAML, which gnostic's Any holds
            parts.append(_message(31, _string(1, key) + _message(2, any_value)))
        else:
            raise ValueError(f"cannot encode the schema key {key!r} in the protobuf form")
    return b"".join(parts)


def _named_schemas(schemas: dict[str, JsonObject]) -> bytes:
    """``Definitions`` or ``Properties``: repeated ``NamedSchema`` (name 1, value 2) as field 1."""
    return b"".join(
        _message(1, _string(1, name) + _message(2, _schema(schema)))
        for name, schema in schemas.items()
    )


def _message(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _string(field: int, value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, not {value!r}")
    return _message(field, value.encode())


def _bool(field: int, value: Any) -> bytes:
    if not isinstance(value, bool):
        raise ValueError(f"expected a boolean, not {value!r}")
    return _varint(field << 3 | _VARINT) + _varint(int(value))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
