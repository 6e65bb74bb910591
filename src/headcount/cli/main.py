"""The `headcount` entry point: parse the command line, run `serve`, `demo` or a simulator.

Bad input ends with one line on stderr naming the problem and exit status 2,
never a traceback nor the whole usage: a mistyped flag gets the nearest one
suggested (`flags/parser.py`), and a setting that cannot be used (`ConfigError`,
a port already taken) is said in one line too. `serve` takes its flags from a
config file and `HEADCOUNT_*` variables too (`serve_config`), read before it
starts. What `serve` accepts but probably does not mean is logged once at start
(`serve_hints`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import uvloop

from headcount import __version__
from headcount.cli.serve_config import add_config_arguments, layer_flags, render_config
from headcount.cli.serve_flags import add_serve_arguments, settings_from_args
from headcount.config import ConfigError
from headcount.flags.parser import CommandParser, fail, given_flags

__all__ = ["main"]

_log = logging.getLogger("headcount.cli")


def _serve(ns: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from headcount.app import serve
    from headcount.cli.serve_hints import serve_hints
    from headcount.logs import configure_logging

    settings = settings_from_args(ns)
    configure_logging(settings.server.log_format.value, settings.server.log_level)
    for hint in serve_hints(settings, given_flags(ns), ns.backends):
        _log.warning("%s", hint)
    return serve(settings)


def _sim_engine(ns: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from headcount.sim import engine

    return engine.serve_until_signalled(engine.config_from_args(ns))


def _sim_apiserver(ns: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from headcount.sim import apiserver

    return apiserver.serve_forever(apiserver.config_from_args(ns), ns.kubeconfig_out)


def _demo(ns: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from headcount.cli.demo import run_demo

    return run_demo(ns)


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="headcount",
        description="OpenAI-compatible router for LLM engine fleets whose picture of the "
        "fleet never silently goes stale.",
    )
    parser.add_argument("--version", action="version", version=f"headcount {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the router")
    add_serve_arguments(serve)
    add_config_arguments(serve)
    serve.set_defaults(run=_serve)

    demo = commands.add_parser("demo", help="the whole story on a simulated cluster")
    demo.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of traffic per act (default: 5)",
    )
    demo.set_defaults(run=_demo)

    sim_engine = commands.add_parser("sim-engine", help="a simulated OpenAI-compatible engine")
    from headcount.sim import engine

    engine.add_arguments(sim_engine)
    sim_engine.set_defaults(run=_sim_engine)

    sim_api = commands.add_parser("sim-apiserver", help="an emulated Kubernetes API server")
    from headcount.sim import apiserver

    apiserver.add_arguments(sim_api)
    sim_api.set_defaults(run=_sim_apiserver)
    return parser


def _configure_serve(ns: argparse.Namespace, parser: CommandParser) -> bool:
    """Merge `--config` and `HEADCOUNT_*` into `ns`; False when `--print-config` is all to do."""
    try:
        chosen = layer_flags(ns, parser, os.environ)
        if ns.print_config:
            settings_from_args(ns)
            sys.stdout.write(render_config(chosen))
            return False
    except ConfigError as exc:
        fail("headcount serve", str(exc))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse(argv)
    if ns.command == "serve" and not _configure_serve(ns, parser.chosen(ns)):
        return 0
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, None]] = ns.run
    try:
        uvloop.run(run(ns))
    except ConfigError as exc:
        fail(f"headcount {ns.command}", str(exc))
    except KeyboardInterrupt:
        return 130
    return 0
