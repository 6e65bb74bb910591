"""How far an engine's cache index may be trusted, in the words `/engines` and `/health` use.

The state is a pure function (`evaluate`) of the facts an engine's stream and
the router recorded (`TrustFacts`) and the time; strongest first:

- `off`: the subscriber holds no session with the publisher (never had one,
  or lost it), or the engine's KV-event endpoint is another engine's too (its
  events cannot be told apart: no subscriber). Routing by load only.
- `stale`: the index may hold blocks the engine no longer has, or miss what it
  surely has; routing ignores it for this engine. Either a request we routed
  there got its first byte (so the engine has stored its new blocks and sent
  the events) `idle_timeout` ago and no batch came since; or the engine's own
  hit counter contradicted the index's predictions over the last check window
  (the index was cleared then, and stays stale until a window agrees).
- `rebuilding`: what it holds is true but it may miss blocks: a gap is being
  replayed, or less than `rebuild_window` ago the index was cleared without
  the engine's cache being empty (a gap the replay could not fill, an
  overflow, a share of memory the index no longer fitted) or trusted again
  after a disagreement, or a stored block's parent was unknown, or a stored
  block was refused for the memory bound. A clear because the engine's cache
  was emptied too (a restart, `AllBlocksCleared`) leaves nothing missing.
- `synced`: events flowing, no unrecovered gap. A publisher that has sent
  nothing since we connected is taken as an empty cache: its first batch's
  sequence number says otherwise (a late join is a gap from 0).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["IndexTrust", "TrustFacts", "evaluate"]


class IndexTrust(enum.StrEnum):
    SYNCED = "synced"
    """Events flowing, no unrecovered gap: the index holds what the engine holds."""
    REBUILDING = "rebuilding"
    """Cleared (or joined late), warming up: what it holds is true, but it may miss blocks."""
    STALE = "stale"
    """It may hold blocks the engine no longer has: routing ignores it for this engine."""
    OFF = "off"
    """No publisher reached: routing by load only for this engine."""

    @property
    def usable(self) -> bool:
        """Whether routing may predict cache hits from the index."""
        return self in (IndexTrust.SYNCED, IndexTrust.REBUILDING)


@dataclass(slots=True)
class TrustFacts:
    """What is known of one engine's stream; times are the registry's clock."""

    endpoint: str
    shared: str | None = None
    """Why the endpoint is not followed: another engine resolves to it too."""
    connected: bool = False
    ever_connected: bool = False
    gap: tuple[int, int] | None = None
    """The missed sequence numbers being replayed: first, and the live one."""
    rebuilding_since: float | None = None
    """When the index last became incomplete but trusted (emptied while the engine's cache
    was not, or trusted again after a disagreement)."""
    rebuilding_why: str = ""
    unknown_parent_at: float | None = None
    """When a stored block last named a parent the index did not know."""
    awaiting_since: float | None = None
    """When a routed request's first byte came with no batch since (events are due)."""
    awaiting_answers: int = 0
    """Routed requests answered (with new blocks) since `awaiting_since`."""
    disagreement: str | None = None
    """Why the last check window found the engine's hits below the predictions."""
    refused_at: float | None = None
    """When a stored block was last refused for the index's memory bound."""
    refused_why: str = ""


def evaluate(
    facts: TrustFacts, now: float, *, idle_timeout: float, rebuild_window: float
) -> tuple[IndexTrust, str]:
    """The trust the facts allow at `now`, and why, in words for people."""
    if facts.shared is not None:
        return IndexTrust.OFF, facts.shared
    if not facts.connected:
        if facts.ever_connected:
            return IndexTrust.OFF, f"lost the publisher at {facts.endpoint}"
        return IndexTrust.OFF, f"no publisher reached at {facts.endpoint}"
    if facts.awaiting_since is not None and now - facts.awaiting_since >= idle_timeout:
        waited, answers = now - facts.awaiting_since, facts.awaiting_answers
        were = "1 request was" if answers == 1 else f"{answers} requests were"
        return IndexTrust.STALE, f"no event for {waited:.0f}s after {were} answered"
    if facts.disagreement is not None:
        return IndexTrust.STALE, facts.disagreement
    if facts.gap is not None:
        first, live = facts.gap
        return IndexTrust.REBUILDING, f"replaying missed batches {first}..{live - 1}"
    since = facts.rebuilding_since
    if since is not None and now - since < rebuild_window:
        return IndexTrust.REBUILDING, f"rebuilding for {now - since:.0f}s: {facts.rebuilding_why}"
    refused = facts.refused_at
    if refused is not None and now - refused < rebuild_window:
        return IndexTrust.REBUILDING, facts.refused_why
    unknown = facts.unknown_parent_at
    if unknown is not None and now - unknown < rebuild_window:
        return IndexTrust.REBUILDING, "the engine stored blocks after a prefix the index missed"
    return IndexTrust.SYNCED, "events flowing"
