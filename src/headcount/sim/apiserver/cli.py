"""The emulator as a program: ``headcount sim-apiserver`` and ``python -m headcount.sim.apiserver``.

So a router, kubectl or a benchmark in another process can talk to it; the
``/_sim/`` API then drives it from outside.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Sequence
from pathlib import Path

from headcount.cli_errors import CommandParser, cannot_listen, fail, field_error
from headcount.cli_values import add_listen_arguments
from headcount.config import ConfigError
from headcount.sim.apiserver.config import ApiServerSimConfig
from headcount.sim.apiserver.server import running_apiserver

__all__ = ["add_arguments", "config_from_args", "main", "serve_forever"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``headcount sim-apiserver``."""
    defaults = ApiServerSimConfig()
    add_listen_arguments(parser, defaults.host, defaults.port)
    parser.add_argument(
        "--kubeconfig-out",
        type=Path,
        default=None,
        help="write a kubeconfig for it to this file (default: none written)",
    )
    parser.add_argument(
        "--bookmark-interval",
        type=float,
        default=defaults.bookmark_interval,
        help=f"seconds between watch bookmarks (default {defaults.bookmark_interval:g})",
    )
    parser.add_argument(
        "--history-size",
        type=int,
        default=defaults.history_size,
        help=f"changes kept for watches to resume from (default {defaults.history_size})",
    )


def config_from_args(args: argparse.Namespace) -> ApiServerSimConfig:
    """The config the parsed options describe; `ConfigError` names a bad flag."""
    try:
        return ApiServerSimConfig(
            host=args.host,
            port=args.port,
            bookmark_interval=args.bookmark_interval,
            history_size=args.history_size,
        )
    except ValueError as exc:
        raise field_error(exc) from None


async def serve_forever(config: ApiServerSimConfig, kubeconfig_out: Path | None = None) -> None:
    """Serve until SIGINT or SIGTERM (or cancellation), printing the URL once listening.

    A port that cannot be bound is a `ConfigError` saying so in one line."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)
    try:
        async with contextlib.AsyncExitStack() as stack:
            try:
                sim = await stack.enter_async_context(running_apiserver(config))
            except OSError as exc:
                raise cannot_listen(config.host, config.port, exc) from None
            if kubeconfig_out is not None:
                sim.kubeconfig(kubeconfig_out)
            where = f" (kubeconfig: {kubeconfig_out})" if kubeconfig_out is not None else ""
            print(f"sim-apiserver serving {sim.url}{where}", flush=True)
            await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signum)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m headcount.sim.apiserver``."""
    parser = CommandParser(
        prog="python -m headcount.sim.apiserver", description="An emulated Kubernetes API server."
    )
    add_arguments(parser)
    args = parser.parse(argv)
    try:
        asyncio.run(serve_forever(config_from_args(args), args.kubeconfig_out))
    except ConfigError as exc:
        fail(parser.prog, str(exc))
