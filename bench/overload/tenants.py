"""Who floods whom: the overload suite's tenants, their keys, how each one sends, the file.

One declaration serves both sides: the tenants file `headcount-flow` reads is
rendered from `TENANTS`, and the load generator sends each tenant's requests
with the same key. The fleet's size (`fleet.py`) sets the rates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from bench.overload.fleet import CAPACITY_RPS, MODEL, OUTPUT_TOKENS, SLOTS

__all__ = [
    "BATCH",
    "CAPPED",
    "INTERACTIVE",
    "SHEDDABLE",
    "TENANTS",
    "Sending",
    "TenantLoad",
    "request_body",
    "tenants_toml",
]


class Sending(Enum):
    OPEN = "open loop, Poisson"
    """At a rate, whatever the answers do."""
    CLOSED = "closed loop"
    """Workers that each send their next request when the last one is answered."""


@dataclass(frozen=True)
class TenantLoad:
    """One tenant as the file declares it and as the load generator sends for it."""

    name: str
    key: str
    sending: Sending
    priority: int | None = None
    """None: left out of the file (the router's default, 0)."""
    weight: float | None = None
    tokens_per_minute: int = 0
    rate_rps: float = 0.0
    """Open loop: requests per second."""
    workers: int = 0
    """Closed loop: concurrent workers at the full flood (scaled by the flood factor)."""
    prompt_words: int = 8
    """About one token each under the simulator's built-in tokenizer (the simulator spends no
    time on a prompt: every request's service time is its output's)."""
    late: bool = False
    """Sends only in the second half of the measured window (the sheddable phase)."""


INTERACTIVE = TenantLoad(
    "interactive",
    "sk-interactive",
    Sending.OPEN,
    priority=10,
    weight=1,
    rate_rps=0.4 * CAPACITY_RPS,
)
LONG_PROMPT_WORDS = 400
"""The priority-0 tenants' prompts, ~410 tokens a request with the answer: fair shares are
counted in tokens, so `capped`'s share of the flood (a quarter: weight 1 of 4) is ~4.7
requests/s when all ask alike, and its `tokens_per_minute` (~0.8/s), not its share, holds it."""
BATCH = (
    TenantLoad(
        "batch-a",
        "sk-batch-a",
        Sending.CLOSED,
        priority=0,
        weight=1,
        workers=3 * SLOTS // 2,
        prompt_words=LONG_PROMPT_WORDS,
    ),
    TenantLoad(
        "batch-b",
        "sk-batch-b",
        Sending.CLOSED,
        priority=0,
        weight=2,
        workers=3 * SLOTS // 2,
        prompt_words=LONG_PROMPT_WORDS,
    ),
)
"""Equal workers (1.5x the fleet's slots each, 3x together): without flow control each gets
half the engines' time whatever its weight; with it, its weight's share."""
CAPPED = TenantLoad(
    "capped",
    "sk-capped",
    Sending.CLOSED,
    tokens_per_minute=20000,
    workers=4,
    prompt_words=LONG_PROMPT_WORDS,
)
"""4 workers: about 8 requests/s wanted, 49 a minute allowed."""
SHEDDABLE = TenantLoad(
    "sheddable", "sk-sheddable", Sending.OPEN, priority=-1, rate_rps=0.25 * CAPACITY_RPS, late=True
)
TENANTS: tuple[TenantLoad, ...] = (INTERACTIVE, *BATCH, CAPPED, SHEDDABLE)


def tenants_toml(tenants: tuple[TenantLoad, ...] = TENANTS) -> str:
    """The tenants file: a `[[tenant]]` table each, unset fields left to the router."""
    lines: list[str] = []
    for tenant in tenants:
        lines += ["[[tenant]]", f"name = {json.dumps(tenant.name)}", f'keys = ["{tenant.key}"]']
        if tenant.priority is not None:
            lines.append(f"priority = {tenant.priority}")
        if tenant.weight is not None:
            lines.append(f"weight = {tenant.weight:g}")
        if tenant.tokens_per_minute:
            lines.append(f"tokens_per_minute = {tenant.tokens_per_minute}")
        lines.append("")
    return "\n".join(lines)


_WORDS = ("queue", "engine", "tenant", "token", "batch", "share", "limit", "router", "slot")


def request_body(tenant: TenantLoad, number: int) -> bytes:
    """A streamed chat of `OUTPUT_TOKENS` tokens, usage asked for; numbered so none repeats."""
    words = " ".join(_WORDS[(number + i) % len(_WORDS)] for i in range(tenant.prompt_words))
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{tenant.name} {number}: {words}"}],
            "max_tokens": OUTPUT_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
