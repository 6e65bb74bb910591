"""The prefix groups of the requests the router routed, counted with decay: what placement plans on.

A group is named by the key of a request's block at depth `GROUP_DEPTH` (the
fourth, 64 tokens at 16 per block; a shorter prompt's last full block). Block
keys chain, so that key names everything before it: the chat template's head
and the first 64 tokens of the system prompt, a tenant's identity in practice,
found with one lookup and no tree. Deeper, short prompts (their unique
question included) would each be a group of their own; shallower, tenants
whose system prompts open alike (a shared preamble) would merge.

The group's size is the head all its requests shared: the first request's
keys (at most `HEAD_MAX` blocks), cut back to what each later one has in
common with them. A chat's later turns share its system prompt with fresh
questions, so a tenant's group holds its system prompt and template, not a
turn. Counts (requests, overflow, prompt blocks) halve every `half_life`
seconds (`decay`, at each plan), so rates follow the traffic and no request
order beyond the decayed counts enters a plan. At most `GROUPS_MAX` groups
are kept: at each decay the faintest go past it, or under `FORGET_BELOW`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from headcount.kvindex.keys import BlockKey
from headcount.routing.kv.placement import PrefixGroup

__all__ = ["FORGET_BELOW", "GROUPS_MAX", "GROUP_DEPTH", "HEAD_MAX", "PrefixTraffic", "group_key"]

GROUP_DEPTH = 4
HEAD_MAX = 1024
"""Blocks of a group's shared head kept: 16,384 tokens at 16 per block."""
GROUPS_MAX = 1024
"""With `HEAD_MAX`, at most a million keys: ~40 MB at worst, a few MB in practice."""
FORGET_BELOW = 0.05


def group_key(keys: Sequence[BlockKey]) -> BlockKey | None:
    """The group of a prompt with block keys `keys`; None for a prompt under one block."""
    if not keys:
        return None
    return keys[min(GROUP_DEPTH, len(keys)) - 1]


@dataclass(slots=True)
class _Group:
    head: list[BlockKey]
    requests: float = 0.0
    overflow: float = 0.0
    prompt_blocks: float = 0.0
    """Summed over the counted requests (decayed alike): the mean is this over `requests`."""


class PrefixTraffic:
    """Decayed counts per prefix group, and of the tail's overflow."""

    def __init__(self, half_life: float) -> None:
        self._half_life = half_life
        self._groups: dict[BlockKey, _Group] = {}
        self.spill_overflow = 0.0
        self.requests = 0.0
        self.unique_blocks = 0.0
        """Blocks of prompts past their group's head, summed (decayed): in-flight requests
        hold about `unique_blocks / requests` each of their own."""

    def __len__(self) -> int:
        return len(self._groups)

    def observe(self, keys: Sequence[BlockKey], prompt_blocks: float) -> BlockKey | None:
        """Count a routed request with block keys `keys`; its group's key."""
        key = group_key(keys)
        if key is None:
            return None
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(list(keys[:HEAD_MAX]))
        else:
            head = group.head
            shared = _shared(head, keys)
            if shared < len(head):
                del head[shared:]
        group.requests += 1
        group.prompt_blocks += prompt_blocks
        self.requests += 1
        self.unique_blocks += max(0.0, prompt_blocks - len(group.head))
        return key

    def overflowed(self, key: BlockKey | None) -> None:
        """A request of group `key` (None: of the tail) left its homes (the spill engines)."""
        group = None if key is None else self._groups.get(key)
        if group is None:
            self.spill_overflow += 1
        else:
            group.overflow += 1

    def groups(self) -> list[PrefixGroup]:
        """The groups as the planner reads them, by key."""
        return [
            PrefixGroup(key, len(g.head), g.requests, g.prompt_blocks / g.requests, g.overflow)
            for key, g in sorted(self._groups.items())
            if g.requests > 0
        ]

    def held_per_request(self) -> float:
        """Blocks a request in flight holds of its own, on average."""
        return self.unique_blocks / self.requests if self.requests > 0 else 0.0

    def decay(self, seconds: float) -> None:
        """`seconds` passed: every count fades; the faintest groups are forgotten."""
        factor = math.pow(0.5, seconds / self._half_life)
        self.spill_overflow *= factor
        self.requests *= factor
        self.unique_blocks *= factor
        for group in self._groups.values():
            group.requests *= factor
            group.overflow *= factor
            group.prompt_blocks *= factor
        faint = [k for k, g in self._groups.items() if g.requests < FORGET_BELOW]
        for key in faint:
            del self._groups[key]
        if len(self._groups) > GROUPS_MAX:
            ranked = sorted(self._groups.items(), key=lambda item: (item[1].requests, item[0]))
            for key, _ in ranked[: len(self._groups) - GROUPS_MAX]:
                del self._groups[key]


def _shared(head: Sequence[BlockKey], keys: Sequence[BlockKey]) -> int:
    """How many leading blocks `head` and `keys` share: keys chain, so equal keys at one depth
    mean equal blocks up to it, and a binary search finds the last."""
    low, high = 0, min(len(head), len(keys))
    while low < high:
        middle = (low + high + 1) // 2
        if head[middle - 1] == keys[middle - 1]:
            low = middle
        else:
            high = middle - 1
    return low
