"""Flags from a TOML file and `HEADCOUNT_*` variables too, and where each value came from.

A Helm chart or a kustomize overlay sets dozens of options more readably as a
config file (a ConfigMap) or environment variables than as a long `args:`
list. Every long flag of a parser is a key: `max-body-size = "32MiB"` in the
file (`max_body_size` too), `HEADCOUNT_MAX_BODY_SIZE=32MiB` in the
environment; the value goes through the flag's own type and choices, so it is
read exactly as on the command line. A flag given wins over the environment,
which wins over the file, which wins over the default. Generic over the
parser's actions, so a new flag is settable everywhere with no list to keep.
Pure: text and mappings in, values and their sources out; a mistake is one
`ConfigError` line naming the file and line, or the variable, and the flag.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headcount.config import ConfigError

__all__ = [
    "ENV_PREFIX",
    "Setting",
    "Source",
    "apply",
    "env_name",
    "from_env",
    "from_toml",
    "long_flags",
    "settings",
    "toml_value",
]

ENV_PREFIX = "HEADCOUNT_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class Source(enum.Enum):
    """Where an effective value came from, weakest first."""

    DEFAULT = "default"
    FILE = "file"
    ENV = "env"
    FLAG = "flag"


@dataclass(frozen=True)
class Setting:
    """One flag's effective value and where it came from (`origin`: `FILE:LINE`, a variable)."""

    flag: str
    value: Any
    source: Source
    origin: str = ""


def long_flags(
    parser: argparse.ArgumentParser, exclude: Collection[str] = ()
) -> dict[str, argparse.Action]:
    """Every action with a long option, by its longest without `--`; help and `exclude` left out."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        longs = [flag for flag in action.option_strings if flag.startswith("--")]
        name = max(longs, key=len) if longs else None
        if name is not None and name not in exclude:
            found[name.removeprefix("--")] = action
    return found


def env_name(flag: str) -> str:
    """The variable that sets `flag` (`max-body-size`: `HEADCOUNT_MAX_BODY_SIZE`)."""
    return ENV_PREFIX + flag.upper().replace("-", "_")


def _nearest(name: str, flags: Iterable[str]) -> str:
    nearest = difflib.get_close_matches(name, list(flags), n=1)
    return f"; did you mean {nearest[0]} (--{nearest[0]})?" if nearest else ""


def _line_of(text: str, key: str) -> int | None:
    pattern = re.compile(rf"""^\s*(\[+\s*)?(["']?){re.escape(key)}\2\s*[=\].]""")
    return next(
        (number for number, line in enumerate(text.splitlines(), 1) if pattern.match(line)), None
    )


def from_toml(text: str, path: Path, flags: Mapping[str, argparse.Action]) -> dict[str, Setting]:
    """The flags a TOML config file sets: top-level keys named as the long flags."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    found: dict[str, Setting] = {}
    for key, raw in document.items():
        line = _line_of(text, key)
        where = f"{path}:{line}" if line else str(path)
        flag = key.replace("_", "-")
        action = flags.get(flag)
        if action is None:
            hint = (
                "; settings are top-level keys, without [sections]"
                if isinstance(raw, dict)
                else _nearest(flag, flags)
            )
            raise ConfigError(f"{where}: unknown setting {key!r}{hint}")
        if flag in found:
            raise ConfigError(f"{where}: {key!r} is set twice (also at {found[flag].origin})")
        found[flag] = Setting(flag, _convert(action, raw, where, flag), Source.FILE, where)
    return found


def from_env(
    environ: Mapping[str, str], flags: Mapping[str, argparse.Action]
) -> dict[str, Setting]:
    """The flags `HEADCOUNT_<FLAG>` variables set; other `HEADCOUNT_` variables are not flags."""
    found: dict[str, Setting] = {}
    for flag, action in flags.items():
        name = env_name(flag)
        if name in environ:
            value = _convert(action, environ[name], f"{name}={environ[name]}", flag)
            found[flag] = Setting(flag, value, Source.ENV, name)
    return found


def _convert(action: argparse.Action, raw: object, where: str, flag: str) -> Any:
    """`raw` (a TOML value or a variable's text) as the flag would have parsed it."""
    if action.nargs == 0:
        if isinstance(action, argparse.BooleanOptionalAction):
            return _boolean(raw, where, flag)
        if isinstance(action.const, bool):
            return action.const if _boolean(raw, where, flag) else not action.const
    if action.nargs is not None:
        raise ConfigError(f"{where}: --{flag} can be given on the command line only")
    text = _text(raw, where, flag)
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as error:
        raise ConfigError(f"{where}: {error} (--{flag})") from None
    if action.choices is not None and value not in action.choices:
        allowed = ", ".join(str(choice) for choice in action.choices)
        raise ConfigError(f"{where}: {text!r} is not one of {allowed} (--{flag})")
    return value


def _boolean(raw: object, where: str, flag: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise ConfigError(f"{where}: --{flag} is true or false")


def _text(raw: object, where: str, flag: str) -> str:
    """A TOML value as the flag's text: numbers as written, a list's items joined by commas."""
    if isinstance(raw, list) and all(
        isinstance(item, (str, int)) and not isinstance(item, bool) for item in raw
    ):
        return ",".join(str(item) for item in raw)
    if isinstance(raw, (str, int, float)) and not isinstance(raw, bool):
        return str(raw)
    shown = "true or false" if isinstance(raw, bool) else type(raw).__name__
    raise ConfigError(f"{where}: --{flag} takes a value, not {shown}")


def settings(
    ns: argparse.Namespace,
    flags: Mapping[str, argparse.Action],
    given: Collection[str],
    *layers: Mapping[str, Setting],
) -> list[Setting]:
    """Every flag's effective setting, in the parser's order: given, else the last layer's."""
    chosen: list[Setting] = []
    for flag, action in flags.items():
        if f"--{flag}" in given:
            chosen.append(Setting(flag, getattr(ns, action.dest), Source.FLAG, f"--{flag}"))
            continue
        layered = [layer[flag] for layer in layers if flag in layer]
        chosen.append(
            layered[-1] if layered else Setting(flag, getattr(ns, action.dest), Source.DEFAULT)
        )
    return chosen


def apply(
    ns: argparse.Namespace, flags: Mapping[str, argparse.Action], chosen: Iterable[Setting]
) -> None:
    """Put the chosen values into `ns`, as if they had been given as flags."""
    for setting in chosen:
        setattr(ns, flags[setting.flag].dest, setting.value)


def toml_value(value: object) -> str | None:
    """`value` written as a TOML value a config file reads back; None: not set."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        items = ("=".join(map(str, item)) if isinstance(item, tuple) else item for item in value)
        return "[" + ", ".join(_quoted(str(item)) for item in items) + "]"
    if isinstance(value, enum.Enum):
        return _quoted(str(value.value))
    return _quoted(str(value))


def _quoted(text: str) -> str:
    escaped = "".join(
        f"\\u{ord(char):04x}" if ord(char) < 0x20 or char in '"\\\x7f' else char for char in text
    )
    return f'"{escaped}"'
