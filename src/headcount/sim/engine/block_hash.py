"""A KV block's identity: its token ids chained with its parent's and the LoRA adapter, as vLLM's.

vLLM's default (`--prefix-caching-hash-algo sha256`): a block's hash is the
SHA-256 of the pickled tuple ``(parent hash or NONE_HASH, token ids, extra
keys)``, where NONE_HASH is the SHA-256 of the pickled seed "vllm-none-hash"
and the extra keys are None or, for a LoRA adapter, ``(adapter name,)``. So
two requests share a block only if everything before it is the same too. On
the wire (KV events) vLLM sends the hash's last 8 bytes as an unsigned int.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence

__all__ = ["NONE_HASH", "block_digests", "wire_hash"]

_PICKLE = pickle.HIGHEST_PROTOCOL
NONE_HASH = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=_PICKLE)).digest()


def block_digests(
    token_ids: Sequence[int],
    block_size: int,
    lora_name: str | None,
    *,
    first: int = 0,
    parent: bytes | None = None,
) -> list[bytes]:
    """The hashes of the full blocks of `token_ids` from block index `first` on,
    chained from `parent` (the hash of block `first - 1`, None for the first block)."""
    extra = (lora_name,) if lora_name is not None else None
    digest = parent or NONE_HASH
    digests: list[bytes] = []
    for start in range(first * block_size, len(token_ids) - block_size + 1, block_size):
        key = (digest, tuple(token_ids[start : start + block_size]), extra)
        digest = hashlib.sha256(pickle.dumps(key, protocol=_PICKLE)).digest()
        digests.append(digest)
    return digests


def wire_hash(digest: bytes) -> int:
    """The hash as vLLM sends it in KV events: its last 8 bytes, big-endian, unsigned."""
    return int.from_bytes(digest[-8:], "big")
