"""Log lines others can provoke at will, kept to one per kind and interval, the rest counted.

An engine decides how often its stream gaps, restarts, reconnects or sends
garbage, a client how often its bodies are refused or kill a parse worker;
each of those deserves a line, but not one per event: a publisher alternating
two sequence numbers would otherwise write megabytes a second.
`LogLimit` writes the first line of each kind, then at most one per
`every` seconds, saying how many like it were left out since the last.
"""

from __future__ import annotations

import logging

from headcount.clock import Clock

__all__ = ["LogLimit"]


class LogLimit:
    """One logger's lines about one source, limited per kind (a short name of the line)."""

    __slots__ = ("_clock", "_every", "_left_out", "_logged_at", "_logger", "left_out")

    def __init__(self, logger: logging.Logger, every: float, clock: Clock) -> None:
        self._logger = logger
        self._every = every
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._left_out: dict[str, int] = {}
        self.left_out = 0
        """Lines left out so far, all kinds."""

    def log(self, kind: str, level: int, message: str, *args: object) -> None:
        """Log `message % args` unless a line of `kind` was logged within the interval."""
        if not self._logger.isEnabledFor(level):
            return
        now = self._clock()
        logged = self._logged_at.get(kind)
        if logged is not None and now - logged < self._every:
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
            self.left_out += 1
            return
        self._logged_at[kind] = now
        left_out = self._left_out.pop(kind, 0)
        if left_out and logged is not None:
            message += " (and %d more like it in the last %.0fs)"
            args = (*args, left_out, now - logged)
        self._logger.log(level, message, *args)
