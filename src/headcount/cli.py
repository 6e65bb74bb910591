"""The `headcount` command: `serve`, `demo`, and the two simulators.

Bad input ends with one line on stderr naming the problem and exit status 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import uvloop

from headcount import __version__
from headcount.config import ConfigError
from headcount.serve_flags import add_serve_arguments, settings_from_args

__all__ = ["main"]


def _serve(ns: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from headcount.app import serve
    from headcount.logs import configure_logging

    settings = settings_from_args(ns)
    configure_logging(settings.server.log_format.value, settings.server.log_level)
    return serve(settings)


def _sim_engine(ns: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from headcount.sim import engine

    return engine.serve_until_signalled(engine.config_from_args(ns))


def _sim_apiserver(ns: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from headcount.sim import apiserver

    return apiserver.serve_forever(apiserver.config_from_args(ns), ns.kubeconfig_out)


def _demo(ns: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from headcount.demo import run_demo

    return run_demo(ns)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headcount",
        description="OpenAI-compatible router for LLM engine fleets whose picture of the "
        "fleet never silently goes stale.",
    )
    parser.add_argument("--version", action="version", version=f"headcount {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the router")
    add_serve_arguments(serve)
    serve.set_defaults(run=_serve)

    demo = commands.add_parser("demo", help="the whole story on a simulated cluster")
    demo.add_argument("--duration", type=float, default=None, help="seconds of traffic per act")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, None]] = ns.run
    try:
        uvloop.run(run(ns))
    except ConfigError as exc:
        parser.exit(2, f"headcount {ns.command}: error: {exc}\n")
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
