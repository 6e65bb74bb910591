"""Measure the memory one engine's KV index keeps per million blocks, and what the events cost.

An engine's `BlockStored` events of `--blocks-per-event` blocks each (block size 16, random
64-bit engine hashes, chains of 64 blocks) are applied to one `EngineIndex` until it holds
`--blocks` blocks; the index's retained memory is what `tracemalloc` counts as still allocated
once the events are gone, or with `--rss` the growth of the process's resident memory
(without tracemalloc's own overhead). It also reports the wire
bytes the same blocks would take at about 6 bytes a block (an engine's hash in msgpack with one
token id per block), to compare.

Usage: `.venv/bin/python -m bench.micro.kv_index_memory [--blocks N] [--blocks-per-event K]
[--rss]`.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import tracemalloc

from headcount.kvevents import BlockStored
from headcount.kvindex.index import EngineIndex

__all__: list[str] = []

BLOCK_SIZE = 16
CHAIN = 64
"""Blocks in one sequence before the next starts from the root."""


def _fill(index: EngineIndex, blocks: int, per_event: int, rng: random.Random) -> None:
    parent: int | None = None
    done = 0
    while done < blocks:
        count = min(per_event, blocks - done)
        hashes = [rng.getrandbits(64) for _ in range(count)]
        tokens = [rng.randrange(150_000) for _ in range(count * BLOCK_SIZE)]
        index.apply(BlockStored(hashes, parent, tokens, BLOCK_SIZE))  # type: ignore[arg-type]
        done += count
        parent = None if done % CHAIN == 0 else hashes[-1]


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--blocks-per-event", type=int, default=16)
    parser.add_argument("--rss", action="store_true", help="measure resident memory instead")
    args = parser.parse_args()
    rng = random.Random(17)
    index = EngineIndex()
    million = 1_000_000 / 2**20
    gc.collect()
    if args.rss:
        before = _rss()
        _fill(index, args.blocks, args.blocks_per_event, rng)
        gc.collect()
        per_block = (_rss() - before) / len(index)
        how = "process RSS growth"
    else:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        _fill(index, args.blocks, args.blocks_per_event, rng)
        gc.collect()
        per_block = (tracemalloc.get_traced_memory()[0] - before) / len(index)
        tracemalloc.stop()
        how = "tracemalloc"
    print(f"blocks held: {len(index):,}")
    print(
        f"index memory ({how}): {per_block:.0f} B/block, {per_block * million:.0f} MiB per million"
    )
    print(f"wire: about 6 B/block, {6 * million:.1f} MiB per million blocks")


if __name__ == "__main__":
    main()
