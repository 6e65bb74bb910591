"""Large LISTs without full garbage collections: a pause around parsing and applying them.

Parsed JSON holds no reference cycles, but its many new objects trigger full
collections: at 5,000 pods they cost as much as the parse itself.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block; restore it as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
