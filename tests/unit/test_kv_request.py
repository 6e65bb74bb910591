"""One kv-aware request's work on its prompt: bounded whatever the engines claim.

An engine is any pod anyone can label, and it names its own KV block size: a
block size of 1 over a long prompt made the router hash a key per token, for
each block size its candidates claimed.
"""

from __future__ import annotations

from collections.abc import Sequence

from headcount.kvindex.keys import BlockKey
from headcount.routing.kv import KvRequest
from headcount.routing.kv.request import BLOCKS_PER_REQUEST
from tests.support import engine


class ClaimedSizes:
    """An index whose engines claim the block sizes given, hold `held` blocks, count keys."""

    def __init__(self, sizes: dict[str, int], held: int) -> None:
        self.sizes = sizes
        self.held = held
        self.keys_given = 0

    def match(self, engine_id: str, keys: Sequence[BlockKey]) -> int | None:
        self.keys_given += len(keys)
        return min(self.held, len(keys))

    def block_size(self, engine_id: str) -> int | None:
        return self.sizes[engine_id]

    def routed(self, engine_id: str, prompt_tokens: int, predicted_cached_tokens: int) -> None:
        pass

    def prefilled(self, engine_id: str, predicted_cached_tokens: int) -> None:
        pass


def test_the_blocks_hashed_for_one_request_are_capped_whatever_block_size_engines_claim() -> None:
    index = ClaimedSizes({"a": 1, "b": 2, "c": 3}, held=100)
    request = KvRequest(index, "m", list(range(450_000)))
    cached = [request.cached(engine(name)) for name in ("a", "b", "c")]
    assert cached[0] == 100
    assert index.keys_given <= BLOCKS_PER_REQUEST  # over every block size claimed
