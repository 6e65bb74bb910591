"""Every module and package declares its public surface in `__all__`; every name there exists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import headcount

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(headcount.__path__, prefix="headcount.")
)


def test_the_package_has_modules() -> None:
    assert "headcount.fleet.fleet" in MODULES and "headcount.proxy.exchange" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_module_declares_all_and_each_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list), f"{name} has no __all__"
    missing = [item for item in exported if not hasattr(module, item)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    assert module.__doc__ and module.__doc__.strip(), (
        f"{name} has no docstring saying why it exists"
    )


LONG = 450
"""Lines past which a module must say in its docstring why it is not split."""


@pytest.mark.parametrize("name", MODULES)
def test_a_module_over_450_lines_says_why_in_its_docstring(name: str) -> None:
    module = importlib.import_module(name)
    source = inspect.getsource(module)
    if source.count("\n") > LONG:
        assert f"Over {LONG} lines" in (module.__doc__ or ""), (
            f"{name} has over {LONG} lines and no 'Over {LONG} lines ...' reason in its docstring"
        )
