"""The container's memory limit, from its cgroup, for defaults that must fit inside it.

A default sized for a machine (512 MiB of buffered request bodies) is the whole
limit of a small container, which the kernel then kills before the router's
own bound says 503. `memory_limit` reads cgroup v2's `memory.max`, else v1's
`memory/memory.limit_in_bytes`, under an injectable root; `parse_memory_limit`
is the pure reading of either file; `buffered_body_default` sizes
`--max-buffered-body-bytes` from the limit.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BUFFERED_SHARE_OF_MEMORY",
    "CGROUP_ROOT",
    "buffered_body_default",
    "memory_limit",
    "parse_memory_limit",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")

BUFFERED_SHARE_OF_MEMORY = 0.25
"""Request bodies may take a quarter of the memory limit: the rest is the interpreter,
the connections' buffers, the fleet's state and the parse workers."""

_CGROUP_FILES = ("memory.max", "memory/memory.limit_in_bytes")
_NO_LIMIT_FROM = 1 << 60
"""cgroup v1 writes "no limit" as the largest page-aligned 64-bit count (about 2**63)."""


def parse_memory_limit(text: str) -> int | None:
    """Bytes from `memory.max` (a number, or `max`) or `memory.limit_in_bytes`; None: no limit."""
    value = text.strip()
    if value == "max" or not value.isdigit():
        return None
    limit = int(value)
    return limit if 0 < limit < _NO_LIMIT_FROM else None


def memory_limit(root: Path = CGROUP_ROOT) -> int | None:
    """This process's cgroup memory limit in bytes (v2, else v1), None when there is none."""
    for name in _CGROUP_FILES:
        try:
            text = (root / name).read_text()
        except OSError:
            continue
        return parse_memory_limit(text)
    return None


def buffered_body_default(limit: int | None, unlimited: int, at_least: int) -> int:
    """`--max-buffered-body-bytes` by default: a share of `limit`, `unlimited` without one.

    Never below `at_least` (the largest body), which a request must be able to fit.
    """
    if limit is None:
        return unlimited
    return max(int(limit * BUFFERED_SHARE_OF_MEMORY), at_least)
