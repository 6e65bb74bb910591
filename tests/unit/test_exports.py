"""Every module and package declares its public surface in `__all__`; every name there exists."""

from __future__ import annotations

import importlib
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
