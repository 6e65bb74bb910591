"""`serve` flags from a TOML file and `HEADCOUNT_*` variables: precedence, errors, sources.

Run over the real `serve` parser, so that every flag it declares (whoever adds
it) is settable from a file and a variable, and `--print-config`'s output is a
config file that reads back to the same settings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from headcount.cli.main import _parser
from headcount.cli.serve_config import CONFIG_FLAGS, render_config
from headcount.cli.serve_flags import settings_from_args
from headcount.config import ConfigError
from headcount.flags.parser import CommandParser, given_flags
from headcount.flags.sources import (
    Setting,
    Source,
    apply,
    env_name,
    from_env,
    from_toml,
    long_flags,
    settings,
    toml_value,
)

__all__: list[str] = []

FILE = Path("/etc/headcount/headcount.toml")


def _serve() -> tuple[CommandParser, dict[str, argparse.Action]]:
    parser = _parser()
    serve = parser.chosen(parser.parse(["serve"]))
    return serve, long_flags(serve, exclude=CONFIG_FLAGS)


def _effective(
    argv: list[str], toml: str = "", environ: dict[str, str] | None = None
) -> tuple[argparse.Namespace, dict[str, Setting]]:
    parser = _parser()
    ns = parser.parse(["serve", *argv])
    _, flags = _serve()
    chosen = settings(
        ns, flags, given_flags(ns), from_toml(toml, FILE, flags), from_env(environ or {}, flags)
    )
    apply(ns, flags, chosen)
    return ns, {setting.flag: setting for setting in chosen}


def test_a_flag_beats_a_variable_which_beats_the_file_which_beats_the_default() -> None:
    toml = 'port = 9000\nadmin-port = 9001\ndrain-delay = "2s"\n'
    environ = {"HEADCOUNT_ADMIN_PORT": "9101", "HEADCOUNT_DRAIN_DELAY": "3", "HEADCOUNT_X": "y"}
    ns, chosen = _effective(["--drain-delay", "4"], toml, environ)
    assert (ns.port, ns.admin_port, ns.drain_delay, ns.drain_timeout) == (9000, 9101, 4.0, 30.0)
    assert chosen["port"] == Setting("port", 9000, Source.FILE, f"{FILE}:1")
    assert chosen["admin-port"] == Setting("admin-port", 9101, Source.ENV, "HEADCOUNT_ADMIN_PORT")
    assert chosen["drain-delay"] == Setting("drain-delay", 4.0, Source.FLAG, "--drain-delay")
    assert chosen["drain-timeout"].source is Source.DEFAULT


def test_values_read_as_their_flag_reads_them() -> None:
    toml = (
        'backends = ["http://a:8000", "http://b:8000"]\n'
        'max_body_size = "16MiB"\n'
        'log-format = "JSON"\n'
        "ready-requires-fresh = true\n"
        'resolve = ["engine=127.0.0.1"]\n'
        "access-log-sample = 0.5\n"
    )
    ns, _ = _effective([], toml, {"HEADCOUNT_READY_REQUIRES_ENGINES": "yes"})
    settings_ = settings_from_args(ns)
    assert settings_.discovery.backends == ("http://a:8000", "http://b:8000")
    assert settings_.proxy.max_body_size == 16 * 1024 * 1024
    assert settings_.server.log_format.value == "json"
    assert settings_.health.ready_requires_fresh is True
    assert settings_.health.ready_requires_engines is True
    assert settings_.dns.pinned == {"engine": "127.0.0.1"}
    assert settings_.proxy.access_log_sample == 0.5


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("\n\nprot = 1\n", f"{FILE}:3: unknown setting 'prot'; did you mean port (--port)?"),
        ("port = 'x'\n", f"{FILE}:1: invalid port 'x': use 0-65535 (--port)"),
        ('log-format = "xml"\n', f"{FILE}:1: 'xml' is not one of text, json (--log-format)"),
        ("ready-requires-fresh = 3\n", f"{FILE}:1: --ready-requires-fresh is true or false"),
        ("port = true\n", f"{FILE}:1: --port takes a value, not true or false"),
        ("[server]\nport = 1\n", f"{FILE}:1: unknown setting 'server'; settings are top-level"),
        (
            "max-body-size = 1\nmax_body_size = 2\n",
            f"{FILE}:2: 'max_body_size' is set twice (also at {FILE}:1)",
        ),
        ("port = \n", f"{FILE}: not valid TOML: Invalid value (at line 1, column 8)"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_line_and_flag(toml: str, message: str) -> None:
    _, flags = _serve()
    with pytest.raises(ConfigError) as error:
        from_toml(toml, FILE, flags)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"HEADCOUNT_PORT": "abc"}, "HEADCOUNT_PORT=abc: invalid port 'abc': use 0-65535 (--port)"),
        ({"HEADCOUNT_DRAIN_DELAY": "soon"}, "HEADCOUNT_DRAIN_DELAY=soon: invalid duration"),
        ({"HEADCOUNT_READY_REQUIRES_FRESH": "maybe"}, "--ready-requires-fresh is true or false"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it_and_its_flag(
    environ: dict[str, str], message: str
) -> None:
    _, flags = _serve()
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_env(environ, flags)


def test_every_serve_flag_is_settable_from_the_file_and_the_environment() -> None:
    """Generic over the parser: a flag someone adds is covered without a list to update."""
    serve, flags = _serve()
    assert len(flags) == len(serve._actions) - 1 - len(CONFIG_FLAGS)  # all but --help
    ns = _parser().parse(["serve"])
    for flag, action in flags.items():
        default = getattr(ns, action.dest)
        written = toml_value(default)
        if written is None:
            continue
        read = from_toml(f"{flag} = {written}\n", FILE, flags)[flag]
        assert read.value == default, flag
        assert env_name(flag) == "HEADCOUNT_" + flag.upper().replace("-", "_")


def test_print_config_reads_back_as_the_same_settings() -> None:
    toml = 'port = 9000\nbackends = ["http://a:8000"]\ntokenizer = "builtin"\n'
    ns, chosen = _effective(["--routing", "least-loaded"], toml, {"HEADCOUNT_PROBE_TIMEOUT": "1"})
    printed = render_config(list(chosen.values()))
    assert "port = 9000  # file /etc/headcount/headcount.toml:1" in printed.splitlines()
    assert "probe-timeout = 1.0  # env HEADCOUNT_PROBE_TIMEOUT" in printed.splitlines()
    assert 'routing = "least-loaded"  # flag' in printed.splitlines()
    assert "# max-connections: not set  # default" in printed.splitlines()
    _, flags = _serve()
    again, _ = _effective([], printed)
    assert settings_from_args(again) == settings_from_args(ns)
    assert len(from_toml(printed, FILE, flags)) == len(
        [line for line in printed.splitlines() if not line.startswith("#")]
    )
