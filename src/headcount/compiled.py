"""Whether the data plane runs compiled by mypyc (`setup.py`) or as Python source, and
whether any compiled module is older than its source.

Python imports a module's compiled form when one sits beside its source, so a checkout
edited after `make install` would run yesterday's code without a word: the router says
so at start, and the test suite refuses to run.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

__all__ = ["data_plane", "stale_compiled"]

_PACKAGE = Path(__file__).parent
_PROBE = "headcount._http.server"
"""A module that is always compiled when the data plane is."""


def data_plane() -> str:
    """`compiled` or `python`: the form the data plane's modules are imported in."""
    spec = importlib.util.find_spec(_PROBE)
    origin = spec.origin if spec is not None else None
    if origin is not None and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        return "compiled"
    return "python"


def stale_compiled(package: Path = _PACKAGE) -> list[str]:
    """Compiled modules below `package` older than their source, as paths relative to it."""
    stale = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for compiled in package.rglob(f"*{suffix}"):
            source = compiled.with_name(compiled.name.removesuffix(suffix) + ".py")
            if source.exists() and source.stat().st_mtime > compiled.stat().st_mtime:
                stale.append(str(source.relative_to(package)))
    return sorted(stale)
