"""Command-line mistakes answered in one line, and the flags a person actually gave.

argparse prints the whole usage (30 lines for `serve`) before an error, reports
a mistyped flag as "unrecognized arguments" with no suggestion, and cannot tell
a flag given on the command line from its default. `CommandParser` (and every
subcommand parser made from it) says `PROG: error: WHAT (see PROG --help)` and
exits with status 2, suggests the nearest flag, and records which flags were
given (`given_flags`), so that start-up hints can speak of those alone.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from headcount.config import ConfigError

__all__ = [
    "CommandParser",
    "cannot_listen",
    "fail",
    "field_error",
    "given_flags",
    "lowercase",
    "mark_given",
    "uppercase",
]

_GIVEN = "_flags_given"
"""The namespace attribute holding the option strings given on the command line."""


def fail(prog: str, message: str) -> NoReturn:
    """Print `PROG: error: MESSAGE` as one line on stderr and exit with status 2."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(2)


def cannot_listen(host: str, port: int, error: OSError) -> ConfigError:
    """A listener's failed bind as the one line the command prints."""
    reason = os.strerror(error.errno) if error.errno else str(error)
    return ConfigError(f"cannot listen on {host}:{port}: {reason}")


def field_error(error: ValueError) -> ConfigError:
    """A config dataclass's `ValueError("some_field must ...")` naming the flag `--some-field`."""
    field, _, reason = str(error).partition(" ")
    return ConfigError(f"--{field.replace('_', '-')} {reason}")


def mark_given(ns: argparse.Namespace, flags: Iterable[str]) -> None:
    """Count `flags` as given (`given_flags`): set from a config file or the environment."""
    given: set[str] = getattr(ns, _GIVEN, set())
    setattr(ns, _GIVEN, given | set(flags))


def lowercase(text: str) -> str:
    """A choice as typed in any case (`--log-format JSON`)."""
    return text.lower()


def uppercase(text: str) -> str:
    """A choice as typed in any case, kept in upper case (`--log-level debug`)."""
    return text.upper()


def given_flags(ns: argparse.Namespace) -> frozenset[str]:
    """The flags given on the command line (their longest spelling), defaults left out."""
    given: set[str] = getattr(ns, _GIVEN, set())
    return frozenset(given)


class _RecordsGiven(argparse.Action):
    """An action that also notes its flag as given (`given_flags`) when the parser meets it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        given: set[str] = getattr(namespace, _GIVEN, set())
        given.add(max(self.option_strings, key=len))
        setattr(namespace, _GIVEN, given)


class _GivenStore(_RecordsGiven, argparse._StoreAction):
    pass


class _GivenStoreTrue(_RecordsGiven, argparse._StoreTrueAction):
    pass


class CommandParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one line, naming the nearest flag to a typo."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _GivenStore)
        self.register("action", "store", _GivenStore)
        self.register("action", "store_true", _GivenStoreTrue)

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see {self.prog} --help)")

    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """`parse_args`, with an unknown flag blamed on the subcommand it was given to."""
        ns, extras = self.parse_known_args(argv)
        if extras:
            owner = self.chosen(ns)
            owner.error(_unknown(extras, owner))
        return ns

    def chosen(self, ns: argparse.Namespace) -> CommandParser:
        """The (sub)command parser whose command `ns` runs: its flags are the ones given."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(ns, action.dest, None) or "")
                if isinstance(chosen, CommandParser):
                    return chosen.chosen(ns)
        return self

    def _flags(self) -> list[str]:
        return [flag for action in self._actions for flag in action.option_strings]


def _unknown(extras: Sequence[str], parser: CommandParser) -> str:
    flags = [extra.split("=", 1)[0] for extra in extras if extra.startswith("-")]
    if not flags:
        return f"unexpected argument {' '.join(extras)!r}"
    nearest = difflib.get_close_matches(flags[0], parser._flags(), n=1)
    hint = f"; did you mean {nearest[0]}?" if nearest else ""
    return f"{flags[0]}: unknown flag{hint}"
