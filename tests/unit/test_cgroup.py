"""`--max-buffered-body-bytes` defaults to a share of the container's cgroup memory limit."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from headcount.cli.serve_flags import add_serve_arguments
from headcount.flags.cgroup import buffered_body_default, memory_limit, parse_memory_limit

__all__: list[str] = []

_MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("536870912\n", 512 * _MIB),
        ("max\n", None),
        ("9223372036854771712\n", None),  # cgroup v1's "no limit"
        ("0\n", None),
        ("", None),
        ("-1\n", None),
    ],
)
def test_memory_limit_files_read_as_bytes_or_no_limit(text: str, limit: int | None) -> None:
    assert parse_memory_limit(text) == limit


def test_cgroup_v2_is_read_before_v1(tmp_path: Path) -> None:
    assert memory_limit(tmp_path) is None
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{256 * _MIB}\n")
    assert memory_limit(tmp_path) == 256 * _MIB
    (tmp_path / "memory.max").write_text(f"{512 * _MIB}\n")
    assert memory_limit(tmp_path) == 512 * _MIB


def test_default_is_a_quarter_of_the_limit_and_never_below_one_body() -> None:
    assert buffered_body_default(512 * _MIB, unlimited=512 * _MIB, at_least=32 * _MIB) == (
        128 * _MIB
    )
    assert buffered_body_default(None, unlimited=512 * _MIB, at_least=32 * _MIB) == 512 * _MIB
    assert buffered_body_default(64 * _MIB, unlimited=512 * _MIB, at_least=32 * _MIB) == (32 * _MIB)


def _buffered_flag(cgroup: Path) -> tuple[argparse.Action, str]:
    """The flag's action and its help as `--help` prints it."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser, cgroup)
    [action] = [a for a in parser._actions if "--max-buffered-body-bytes" in a.option_strings]
    return action, parser._get_formatter()._expand_help(action)


def test_serve_default_and_help_follow_the_containers_limit(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text(f"{512 * _MIB}\n")
    action, text = _buffered_flag(tmp_path)
    assert action.default == 128 * _MIB
    assert "25% of the container's memory limit" in text
    assert text.endswith("512MiB without one (default 128MiB)")


def test_serve_default_without_a_limit_is_512mib(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("max\n")
    assert _buffered_flag(tmp_path)[0].default == 512 * _MIB
