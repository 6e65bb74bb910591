"""The shared vLLM KV-event fixtures (`tests/fixtures/vllm-kv-events/`), read for tests.

Each file holds what vLLM's own publisher published (`batches`, as JSON
meanings) and the frames a SUB socket and a replay DEALER received.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from headcount.kvevents import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    Layout,
)
from tests.support.paths import REPO

__all__ = [
    "TOPIC",
    "VERSIONS",
    "expected_batches",
    "expected_event",
    "fixture",
    "frames_of",
]

FIXTURES = REPO / "tests" / "fixtures" / "vllm-kv-events"
VERSIONS: list[tuple[str, Layout]] = [("0.10.1", "0.10"), ("0.33.0", "current")]
TOPIC = b"kv-events"


def fixture(version: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"vllm-{version}.json").read_text())
    return data


def frames_of(encoded: list[str]) -> list[bytes]:
    return [base64.b64decode(frame) for frame in encoded]


def wire_hash(value: int | str) -> BlockHash:
    """The fixtures' JSON holds bytes hashes as base64 strings."""
    return base64.b64decode(value) if isinstance(value, str) else value


def expected_event(meaning: list[Any] | dict[str, Any]) -> KvEvent:
    """An event from its JSON meaning in the fixture, built field by field."""
    if isinstance(meaning, list):  # vLLM 0.10: tag first, then the fields in order
        tag, *fields = meaning
        if tag == "BlockStored":
            hashes, parent, tokens, block_size, lora_id = fields
            return BlockStored(hashes, parent, tokens, block_size, lora_id=lora_id)
        return BlockRemoved(fields[0]) if tag == "BlockRemoved" else AllBlocksCleared()
    fields = {key: value for key, value in meaning.items() if key != "type"}
    if "block_hashes" in fields:
        fields["block_hashes"] = [wire_hash(h) for h in fields["block_hashes"]]
    if fields.get("parent_block_hash") is not None:
        fields["parent_block_hash"] = wire_hash(fields["parent_block_hash"])
    kinds: dict[str, type[KvEvent]] = {
        "BlockStored": BlockStored,
        "BlockRemoved": BlockRemoved,
        "AllBlocksCleared": AllBlocksCleared,
    }
    return kinds[meaning["type"]](**fields)


def expected_batches(version: str) -> dict[int, EventBatch]:
    return {
        item["seq"]: EventBatch(
            item["meaning"][0], [expected_event(e) for e in item["meaning"][1]], item["meaning"][2]
        )
        for item in fixture(version)["batches"]
    }
