"""`headcount serve --config FILE`, `HEADCOUNT_*` variables and `--print-config`.

The flags of `serve` can also come from a TOML file and the environment
(`flags/sources.py` reads both, generically over the parser's flags): this
module declares the two flags that govern that, reads the file before the
event loop starts, puts the merged values into the parsed namespace, and
writes the effective settings, each with its source, as a TOML file that
`--config` reads back.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from headcount.config import ConfigError
from headcount.flags.parser import given_flags, mark_given
from headcount.flags.sources import (
    Setting,
    Source,
    apply,
    from_env,
    from_toml,
    long_flags,
    settings,
    toml_value,
)

__all__ = ["CONFIG_FLAGS", "add_config_arguments", "layer_flags", "render_config"]

CONFIG_FLAGS = ("--config", "--print-config")
"""The flags about configuration itself, which neither a file nor a variable sets."""


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` and `--print-config`."""
    group = parser.add_argument_group(
        "configuration",
        "Every flag can be set in the --config file by its long name (port = 8080, "
        'max-body-size = "32MiB") or by a variable HEADCOUNT_<FLAG> (HEADCOUNT_MAX_BODY_SIZE); '
        "a variable overrides the file, a flag overrides both.",
    )
    group.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        default=None,
        help="TOML file of settings, keyed by the flags' long names (default: none)",
    )
    group.add_argument(
        "--print-config",
        action="store_true",
        default=False,
        help="print every effective setting as TOML, each with where it came from "
        "(default, file, env, flag), then exit (default: off)",
    )


def layer_flags(
    ns: argparse.Namespace, parser: argparse.ArgumentParser, environ: Mapping[str, str]
) -> list[Setting]:
    """Merge `--config` and `environ` into `ns` under the flags given; every flag's setting.

    Reads the file: call it before the event loop runs. A flag set by the file or
    a variable counts as given afterwards (start-up hints speak of it).
    """
    flags = long_flags(parser, exclude=CONFIG_FLAGS)
    from_file: dict[str, Setting] = {}
    if ns.config is not None:
        try:
            text = ns.config.read_text()
        except OSError as error:
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise ConfigError(f"--config {ns.config}: {reason}") from None
        from_file = from_toml(text, ns.config, flags)
    chosen = settings(ns, flags, given_flags(ns), from_file, from_env(environ, flags))
    apply(ns, flags, chosen)
    mark_given(ns, (f"--{s.flag}" for s in chosen if s.source is not Source.DEFAULT))
    return chosen


def render_config(chosen: Sequence[Setting]) -> str:
    """The settings as a TOML file, each line saying where its value came from."""
    lines = ["# headcount serve: effective settings (source: default, file, env or flag)"]
    for setting in chosen:
        source = setting.source.value
        if setting.source in (Source.FILE, Source.ENV):
            source += f" {setting.origin}"
        value = toml_value(setting.value)
        if value is None:
            lines.append(f"# {setting.flag}: not set  # {source}")
        else:
            lines.append(f"{setting.flag} = {value}  # {source}")
    return "\n".join(lines) + "\n"
