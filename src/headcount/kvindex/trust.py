"""How far an engine's cache index may be trusted, in the words `/engines` and `/health` use.

The state is a pure function (`evaluate`) of the facts an engine's stream and
the router recorded (`TrustFacts`) and the time; strongest first:

- `off`: the subscriber holds no session with the publisher (never had one,
  or lost it), or holds one that nothing has confirmed yet (no batch in
  sequence, no answer to the liveness check: a port that takes connections
  is not yet a stream that is complete), or the engine's KV-event endpoint is
  another engine's too (its events cannot be told apart: no subscriber).
  Routing by load only.
- `stale`: the index may hold blocks the engine no longer has, or miss what it
  surely has; routing ignores it for this engine. Either nothing confirmed
  the stream complete for `idle_timeout` (no batch in sequence, and the
  replay socket did not answer the liveness check: the subscriber asks it for
  what follows the last batch applied after every `check_interval` without
  a batch, so a quiet engine is confirmed as often as a busy one; traffic
  does not enter into it); or
  the engine's own hit counter contradicted the index's predictions over the
  last check window (the index was cleared then, and stays stale until a
  window agrees).
- `rebuilding`: what it holds is true but it may miss blocks: a gap is being
  replayed, or less than `rebuild_window` ago the index was cleared without
  the engine's cache being empty (a gap the replay could not fill, an
  overflow, a share of memory the index no longer fitted) or trusted again
  after a disagreement, or a stored block's parent was unknown, or a stored
  block was refused for the memory bound. A clear because the engine's cache
  was emptied too (a restart, `AllBlocksCleared`) leaves nothing missing.
- `synced`: the stream was confirmed complete less than `idle_timeout` ago
  (a batch in sequence, or the publisher's answer that its latest batch is
  the one last applied, or that it has published none: an empty cache), no
  unrecovered gap.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["IndexTrust", "TrustFacts", "evaluate"]


class IndexTrust(enum.StrEnum):
    SYNCED = "synced"
    """Confirmed complete lately, no unrecovered gap: the index holds what the engine holds."""
    REBUILDING = "rebuilding"
    """Cleared (or joined late), warming up: what it holds is true, but it may miss blocks."""
    STALE = "stale"
    """It may hold blocks the engine no longer has: routing ignores it for this engine."""
    OFF = "off"
    """No publisher reached, or not yet confirmed: routing by load only for this engine."""

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
    confirmed_at: float | None = None
    """When the stream was last shown complete in this session: a batch in sequence, or the
    publisher's answer to the liveness check; None: not yet."""
    confirmed_how: str = ""
    """How it was last confirmed, in words for people: the reason `synced` gives."""
    unconfirmed_why: str | None = None
    """Why the last liveness check since `confirmed_at` failed; None: none failed."""
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
    failed = facts.unconfirmed_why
    if facts.confirmed_at is None:
        waiting = "waiting for a batch or an answer to the liveness check"
        return (
            IndexTrust.OFF,
            f"connected to {facts.endpoint}, not yet confirmed: {failed or waiting}",
        )
    unconfirmed = now - facts.confirmed_at
    if unconfirmed >= idle_timeout:
        why = failed or "no batch and no liveness check answered"
        return IndexTrust.STALE, f"not confirmed for {unconfirmed:.0f}s: {why}"
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
    return IndexTrust.SYNCED, facts.confirmed_how
