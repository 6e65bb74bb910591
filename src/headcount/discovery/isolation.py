"""Per-object isolation: one malformed Kubernetes object never hides the others.

A source maps every object through `Isolation.apply`; an object that raises is
skipped and logged once per resourceVersion, so a bad object neither stops the
loop nor floods the log on every relist.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from headcount.discovery.listwatch import KubeObject, object_key

__all__ = ["Isolation"]

_log = logging.getLogger(__name__)

T = TypeVar("T")


class Isolation:
    """Per-object isolation: one object's failure is contained and logged once per version.

    `apply(step, obj)` returns the step's result, or None when it raises;
    `reject(obj, reason)` logs why an object is skipped. The same object at the
    same resourceVersion is logged once.
    """

    _MAX_REMEMBERED = 4096

    def __init__(self, what: str) -> None:
        self._what = what
        self._logged: dict[str, str] = {}

    def apply(self, step: Callable[[KubeObject], T], obj: KubeObject) -> T | None:
        try:
            return step(obj)
        except Exception as exc:
            self.reject(obj, f"malformed: {exc!r}")
            return None

    def reject(self, obj: KubeObject, reason: str) -> None:
        uid, version = object_key(obj)
        if self._logged.get(uid) == version:
            return
        if len(self._logged) >= self._MAX_REMEMBERED:
            self._logged.clear()
        self._logged[uid] = version
        _log.warning(
            "%s: skipping %s (uid %s, resourceVersion %s): %s",
            self._what,
            _object_name(obj),
            uid or "?",
            version or "?",
            reason,
        )


def _object_name(obj: KubeObject) -> str:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    if isinstance(metadata, Mapping):
        return f"{metadata.get('namespace', '?')}/{metadata.get('name', '?')}"
    return "?"
