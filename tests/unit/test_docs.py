"""Proves the documentation stands on its own: every reference it makes resolves in the repo.

A reader of a clone (or of the image's source) has only the repository. So the
README, docs/, deploy/README.md and bench/RESULTS.md may link only to files
and headings that exist in it, and name only repository files that exist:
markdown links (relative to the document, with their `#anchor`), and paths in
code spans and code blocks that start at a top-level directory
(`src/headcount/fleet.py`) or are module and document names (`fleet.py`,
`RESULTS.md`, found anywhere in the tree). Nothing may point outside the
repository (a design document beside it, a directory shared with it).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

__all__: list[str] = []

ROOT = REPO
DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        ROOT / "deploy" / "README.md",
        ROOT / "bench" / "RESULTS.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)
_TOP_LEVEL = ("src/headcount/", "tests/", "bench/", "deploy/", "docs/")
_SKIPPED_DIRS = frozenset({".git", ".venv", ".cache", "node_modules", "__pycache__", "out"})
_NAMED_FILE = re.compile(r"[\w.-]+\.(?:py|md)")

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
_PATH_TOKEN = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")


def _repository_files() -> set[str]:
    """The names of the files in the repository; skipped directories are never entered (the
    venv and caches hold tens of thousands)."""
    names: set[str] = set()
    for _, directories, files in os.walk(ROOT):
        directories[:] = [name for name in directories if name not in _SKIPPED_DIRS]
        names.update(files)
    return names


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(document: Path) -> set[str]:
    text = _FENCE.sub("", document.read_text())
    return {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def _links(text: str) -> Iterator[str]:
    for target in _LINK.findall(_FENCE.sub("", text)):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):
            yield target


def _path_references(text: str) -> Iterator[str]:
    """Path-like words of code spans and code blocks (shell commands, layouts)."""
    prose = _FENCE.sub("", text)
    words = [span.strip() for span in _CODE_SPAN.findall(prose)]
    for block in _FENCE.findall(text):
        words.extend(block.split())
    for word in words:
        word = word.strip("\"'(),;:")
        if _PATH_TOKEN.fullmatch(word):
            yield word


def _resolves(resolved: Path, anchor: str, root: Path) -> bool:
    if not resolved.is_relative_to(root) or not resolved.exists():
        return False
    return not anchor or resolved.suffix != ".md" or anchor in _anchors(resolved)


def _broken_links(document: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for target in _links(document.read_text()):
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not _resolves(resolved, anchor, root):
            broken.append(target)
    return broken


def _missing_paths(document: Path, files: set[str], root: Path = ROOT) -> list[str]:
    missing = []
    for word in _path_references(document.read_text()):
        generated = any(part.startswith(".") or part in _SKIPPED_DIRS for part in word.split("/"))
        if word.startswith(_TOP_LEVEL) and not generated:
            if not (root / word).exists():
                missing.append(word)
        elif _NAMED_FILE.fullmatch(word) and word not in files:
            missing.append(word)
    return missing


@pytest.fixture(scope="module")
def repository_files() -> set[str]:
    return _repository_files()


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(document: Path) -> None:
    assert _broken_links(document) == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_file_named_exists_in_the_repository(
    document: Path, repository_files: set[str]
) -> None:
    assert _missing_paths(document, repository_files) == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(document: Path) -> None:
    text = document.read_text()
    assert "../shared" not in text
    assert "DESIGN.md" not in text


def test_deploy_files_point_at_nothing_outside_the_repository() -> None:
    for path in (ROOT / "deploy").rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "DESIGN.md" not in text, path
            assert "../shared" not in text, path


def test_checks_catch_a_missing_file_a_dead_link_and_a_dead_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# headcount\n## Run it\n")
    (tmp_path / "docs" / "ARCHITECTURE.md").write_text("# Architecture\n## Health model\n")
    document = tmp_path / "docs" / "check-me.md"
    document.write_text(
        "See [the design](../../DESIGN.md), [flags](../README.md#no-such-heading),\n"
        "[run](../README.md#run-it), [health](ARCHITECTURE.md#health-model),\n"
        "`docs/ARCHITECTURE.md`, `src/headcount/nowhere.py`, `vanished.py`, `fleet.py`,\n"
        "`app.kubernetes.io/name`, `/v1/models`, `bench/out/a.md`, `src/kv_index/lib.rs`.\n"
        "```sh\nbash bench/missing.sh\n```\n"
    )
    assert _broken_links(document, tmp_path) == [
        "../../DESIGN.md",
        "../README.md#no-such-heading",
    ]
    assert _missing_paths(document, {"fleet.py"}, tmp_path) == [
        "src/headcount/nowhere.py",
        "vanished.py",
        "bench/missing.sh",
    ]


def _layout(developing: str) -> set[str]:
    """The paths DEVELOPING.md's layout block lists below `src/headcount/` (two spaces a level)."""
    block = _FENCE.findall(developing[developing.index("## Layout") :])[0]
    listed: set[str] = set()
    folders: list[str] = []
    for line in block.splitlines()[1:-1]:
        name = line.split()[0]
        depth = (len(line) - len(line.lstrip())) // 2
        del folders[depth:]
        path = "/".join([*folders, name])
        if path.startswith("src/headcount/") and path != "src/headcount/":
            listed.add(path.removeprefix("src/headcount/"))
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
    return listed


def _modules(package: Path) -> set[str]:
    """Every module and package below `package`, as the layout names them (`fleet/engine.py`)."""
    found = set()
    for path in package.rglob("*.py"):
        relative = path.relative_to(package)
        if path.name in ("__init__.py", "__main__.py"):
            if relative.parent != Path("."):
                found.add(f"{relative.parent.as_posix()}/")
        else:
            found.add(relative.as_posix())
    return found


def test_the_layout_names_every_module() -> None:
    listed = _layout((ROOT / "docs" / "DEVELOPING.md").read_text())
    actual = _modules(ROOT / "src" / "headcount")
    assert sorted(actual - listed) == [], "modules DEVELOPING.md's layout does not name"
    assert sorted(listed - actual) == [], "names in the layout that are no module"


def test_the_layout_check_sees_a_missing_and_a_stale_module(tmp_path: Path) -> None:
    (tmp_path / "fleet").mkdir()
    for name in ("__init__.py", "app.py", "fleet/__init__.py", "fleet/engine.py"):
        (tmp_path / name).write_text("")
    developing = (
        "## Layout\n```\nsrc/headcount/\n  app.py      wiring\n  fleet/      the fleet\n"
        "    gone.py   a module since removed\ntests/      tests\n```\n"
    )
    listed = _layout(developing)
    assert listed == {"app.py", "fleet/", "fleet/gone.py"}
    assert _modules(tmp_path) - listed == {"fleet/engine.py"}


def test_license_is_the_one_the_package_declares() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert declared == {"text": "Apache-2.0"}
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text


def test_architecture_is_linked_from_the_readme() -> None:
    assert "docs/ARCHITECTURE.md" in set(_links((ROOT / "README.md").read_text()))


def test_readme_names_every_package_make_fetches() -> None:
    fetched = set(re.findall(r"apt-get download ([\w.+-]+)", (ROOT / "Makefile").read_text()))
    assert fetched >= {"kubernetes-client", "prometheus"}
    readme = (ROOT / "README.md").read_text()
    assert {package for package in fetched if f"`{package}`" not in readme} == set()
