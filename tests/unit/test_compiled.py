"""The suite runs on the data plane it was asked to: compiled, or Python source.

`make test` runs the suite with `HEADCOUNT_DATA_PLANE=compiled`, then again on a copy of
the sources without the compiled modules with `HEADCOUNT_DATA_PLANE=python`; were a build
to fail quietly, or a compiled module to shadow the copy, this says so.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import time
from pathlib import Path

import pytest

from headcount.compiled import data_plane, source_of, stale_compiled

EXPECTED = os.environ.get("HEADCOUNT_DATA_PLANE")
DATA_PLANE_MODULES = (
    "headcount._http.server",
    "headcount.proxy.exchange",
    "headcount.flow.control",
)


@pytest.mark.skipif(EXPECTED is None, reason="HEADCOUNT_DATA_PLANE not set: either may run")
def test_the_data_plane_is_in_the_form_asked_for() -> None:
    assert data_plane() == EXPECTED
    compiled = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for name in DATA_PLANE_MODULES:
        path = importlib.import_module(name).__file__ or ""
        assert path.endswith(compiled) == (EXPECTED == "compiled"), f"{name}: {path}"


def test_a_compiled_module_older_than_its_source_is_named(tmp_path: Path) -> None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / "proxy").mkdir()
    now = time.time()
    for name, source_age, compiled_age in (("fresh", 20, 10), ("stale", 10, 20)):
        source = tmp_path / "proxy" / f"{name}.py"
        compiled = tmp_path / "proxy" / f"{name}{suffix}"
        source.write_text("")
        compiled.write_bytes(b"")
        os.utime(source, (now - source_age, now - source_age))
        os.utime(compiled, (now - compiled_age, now - compiled_age))
    (tmp_path / "proxy" / "only_source.py").write_text("")
    assert stale_compiled(tmp_path) == ["proxy/stale.py"]


def test_a_compiled_module_names_the_source_it_came_from() -> None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    assert source_of(f"/a/b.c/server{suffix}") == Path("/a/b.c/server.py")
    assert source_of("/a/server.py") == Path("/a/server.py")
