"""Every flag of every command explains itself: a help line with its default; choices any case."""

from __future__ import annotations

import argparse
import re

import pytest

from headcount.cli.main import _parser
from headcount.cli.serve_flags import settings_from_args
from headcount.config import DiscoveryMode, LogFormat, RoutingName
from headcount.flags.parser import given_flags
from tests.support import REPO

COMMANDS = ("serve", "demo", "sim-engine", "sim-apiserver")
_DEFAULT = re.compile(r"\(default ([^):]+)\)")


def command(name: str) -> argparse.ArgumentParser:
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            parser: argparse.ArgumentParser = action.choices[name]
            return parser
    raise AssertionError("no subcommands")


def flags(name: str) -> list[argparse.Action]:
    return [a for a in command(name)._actions if not isinstance(a, argparse._HelpAction)]


def expanded_help(name: str, action: argparse.Action) -> str:
    return command(name)._get_formatter()._expand_help(action)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_flag_has_a_help_line_that_gives_its_default(name: str) -> None:
    for action in flags(name):
        text = expanded_help(name, action)
        assert text, f"{name} {action.option_strings[0]} has no help"
        assert "default" in text, f"{name} {action.option_strings[0]}: {text}"


@pytest.mark.parametrize("name", COMMANDS)
def test_a_flag_with_a_default_value_shows_the_value_it_parses_to(name: str) -> None:
    for action in flags(name):
        if action.default in (None, False, "", ()):
            continue
        text = expanded_help(name, action)
        shown = _DEFAULT.search(text)
        assert shown, f"{name} {action.option_strings[0]}: no '(default VALUE)' in {text!r}"
        parse = action.type if callable(action.type) else str
        assert parse(shown.group(1)) == action.default, (
            f"{name} {action.option_strings[0]}: shows {shown.group(1)}, is {action.default!r}"
        )


def test_choices_are_taken_in_any_case() -> None:
    ns = _parser().parse(
        [
            "serve",
            "--backends",
            "http://127.0.0.1:1",
            "--log-format",
            "JSON",
            "--log-level",
            "debug",
            "--routing",
            "Least-Loaded",
            "--discovery",
            "STATIC",
        ]
    )
    settings = settings_from_args(ns)
    assert settings.server.log_format is LogFormat.JSON
    assert settings.server.log_level == "DEBUG"
    assert settings.proxy.routing is RoutingName.LEAST_LOADED
    assert settings.discovery.mode is DiscoveryMode.STATIC
    assert _parser().parse(["sim-engine", "--fail-mode", "HTTP-500"]).fail_mode == "http-500"


def test_only_the_flags_given_are_known_as_given() -> None:
    ns = _parser().parse(
        [
            "serve",
            "--backends",
            "http://h:1",
            "--namespace=x",
            "--probe-int",
            "3",
            "--ready-requires-fresh",
        ]
    )
    assert given_flags(ns) == {
        "--backends",
        "--namespace",
        "--probe-interval",
        "--ready-requires-fresh",
    }


def test_every_serve_flag_is_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    missing = [
        flag
        for action in flags("serve")
        for flag in action.option_strings
        if f"`{flag}`" not in readme and f"`{flag} " not in readme
    ]
    assert missing == []
