"""The import graph of `src/headcount` has no circle and no arrow that runs upward.

A contract belongs below the code that implements it, so every part of the
package has a layer, and a module may import only from its own layer or
below. Imports inside `if TYPE_CHECKING:` count too: a type-only import is
still a dependency a reader must follow. Within a part, modules may import one
another, never in a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.support import REPO

__all__: list[str] = []

SRC = REPO / "src"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"", "clock", "compiled", "log_limit", "logs", "pool_spec", "selectors"}),
    frozenset({"config"}),
    frozenset({"flags", "_http", "kvevents", "tokens", "auth", "supervise"}),
    frozenset({"fleet", "sim"}),
    frozenset({"kvindex", "discovery", "probe", "flow"}),
    frozenset({"routing", "surfaces"}),
    frozenset({"proxy"}),
    frozenset({"gateway"}),
    frozenset({"app"}),
    frozenset({"cli"}),
)
"""Bottom first. `""` is the package's own `__init__` (its version)."""


def modules(root: Path) -> dict[str, Path]:
    """Every module below `root` by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, package: str, known: Mapping[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        submodules = [f"{module}.{alias.name}" for alias in node.names]
        if all(name in known for name in submodules):
            yield from submodules
        else:
            yield module


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports, type-only imports included."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _imported(node, package, known):
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _part(module: str, top: str) -> str:
    rest = module.removeprefix(top).removeprefix(".")
    return rest.partition(".")[0]


def upward(
    graph: Mapping[str, set[str]], top: str, layers: tuple[frozenset[str], ...]
) -> list[str]:
    """Every import from a part of `top` into a part of a higher layer, as `a -> b`."""
    layer = {part: level for level, parts in enumerate(layers) for part in parts}
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if layer[_part(target, top)] > layer[_part(source, top)]
    )


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {_part(name, "headcount") for name in modules(SRC)}
    layered = set().union(*LAYERS)
    assert parts == layered, f"unlayered: {parts - layered}; gone: {layered - parts}"


def test_no_module_imports_in_a_circle() -> None:
    assert circles(import_graph(SRC)) == []


def test_no_import_runs_upward() -> None:
    assert upward(import_graph(SRC), "headcount", LAYERS) == []


def test_the_checks_see_a_circle_and_an_upward_arrow(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("from pkg.low import a\n")
    (package / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import b\n"
    )
    (package / "high.py").write_text("from pkg.low.a import x\nimport pkg.low.b\n")
    (package / "low" / "b.py").write_text("from . import a\n")
    graph = import_graph(tmp_path)
    assert circles(graph) == [["pkg.high", "pkg.low.a", "pkg.low.b"]]
    layers = (frozenset({"", "low"}), frozenset({"high"}))
    assert upward(graph, "pkg", layers) == ["pkg.low.a -> pkg.high"]
