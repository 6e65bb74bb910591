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

__all__ = ["data_plane", "source_of", "stale_compiled"]

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


def source_of(module_file: str | Path) -> Path:
    """The source a module's file was compiled from (`x.cpython-311-….so` → `x.py`); a
    source file is its own."""
    path = Path(module_file)
    return path.with_name(path.name.split(".", 1)[0] + ".py")


def stale_compiled(package: Path = _PACKAGE) -> list[str]:
    """Compiled modules below `package` older than their source, as paths relative to it."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    stale = []
    for compiled in package.rglob("*"):
        if compiled.name.endswith(suffixes):
            source = source_of(compiled)
            if source.exists() and source.stat().st_mtime > compiled.stat().st_mtime:
                stale.append(str(source.relative_to(package)))
    return sorted(stale)
