"""Every module and package declares its public surface in `__all__`; every name there exists."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil

import pytest

import headcount
from headcount.compiled import source_of

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(headcount.__path__, prefix="headcount.")
)


def test_the_package_has_modules() -> None:
    assert "headcount.fleet.fleet" in MODULES and "headcount.proxy.exchange" in MODULES


def _source(name: str) -> str:
    """The module's source: read from its file, since a module mypyc compiled keeps no
    docstring and no source of its own."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    return source_of(spec.origin).read_text()


def _docstring(name: str) -> str:
    return ast.get_docstring(ast.parse(_source(name))) or ""


@pytest.mark.parametrize("name", MODULES)
def test_module_declares_all_and_each_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list), f"{name} has no __all__"
    missing = [item for item in exported if not hasattr(module, item)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    assert _docstring(name).strip(), f"{name} has no docstring saying why it exists"


LONG = 450
"""Lines past which a module must say in its docstring why it is not split."""


@pytest.mark.parametrize("name", MODULES)
def test_a_module_over_450_lines_says_why_in_its_docstring(name: str) -> None:
    if _source(name).count("\n") > LONG:
        assert f"Over {LONG} lines" in _docstring(name), (
            f"{name} has over {LONG} lines and no 'Over {LONG} lines ...' reason in its docstring"
        )
