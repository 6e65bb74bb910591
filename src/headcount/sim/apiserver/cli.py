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

from headcount.config import ConfigError
from headcount.flags.parser import CommandParser, cannot_listen, fail, field_error
from headcount.flags.values import add_listen_arguments
from headcount.sim.apiserver.config import ApiServerSimConfig
from headcount.sim.apiserver.kubelet import POD_IP_ANNOTATION, address_range
from headcount.sim.apiserver.server import running_apiserver

__all__ = ["EPILOG", "add_arguments", "config_from_args", "main", "serve_forever"]

EPILOG = f"""\
the admin API, on both ports (JSON bodies; the admin port answers whatever the faults):
  GET    /_sim/state                                   version, open watches, faults on
  POST   /_sim/faults/drop-watches   {{"reset": true}}   end every watch (EOF, or TCP reset)
  POST   /_sim/faults/refuse         {{"seconds": N}}    close the API port for N seconds
  POST   /_sim/faults/blackhole                        accept, never answer
  POST   /_sim/faults/stall                            watches silent, lists answer
  POST   /_sim/faults/compact                          older resourceVersions answer 410
  POST   /_sim/faults/restore                          undo refuse, blackhole and stall
  PUT    /_sim/objects                                 create or replace (kind in the body)
  PATCH  /_sim/objects/PLURAL/NAMESPACE/NAME           JSON merge patch
  DELETE /_sim/objects/PLURAL/NAMESPACE/NAME[?graceful=true]
e.g. curl -X POST ADMIN_URL/_sim/faults/refuse -d '{{"seconds": 10}}'

--kubelet: a pod created without an IP gets one after --kubelet-delay (its
{POD_IP_ANNOTATION} annotation, else the lowest free address of --kubelet-ips),
then phase Running and Ready=True, so sim-engines on those addresses serve it."""


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
    parser.add_argument(
        "--admin-port",
        type=int,
        default=0,
        help="a second port serving only /_sim/, whatever the faults; 0: any free port (default 0)",
    )
    parser.add_argument(
        "--kubelet",
        action="store_true",
        help="start new pods like a kubelet: a pod IP, Running, Ready (default: off)",
    )
    parser.add_argument(
        "--kubelet-delay",
        type=float,
        default=defaults.kubelet_delay,
        help=f"seconds from a pod's creation to its start (default {defaults.kubelet_delay:g})",
    )
    parser.add_argument(
        "--kubelet-ips",
        type=address_range,
        default=defaults.kubelet_addresses,
        metavar="FIRST-LAST",
        help="the pod IPs --kubelet hands out, lowest free first (default "
        f"{defaults.kubelet_addresses[0]}-{defaults.kubelet_addresses[-1]})",
    )
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def config_from_args(args: argparse.Namespace) -> ApiServerSimConfig:
    """The config the parsed options describe; `ConfigError` names a bad flag."""
    try:
        return ApiServerSimConfig(
            host=args.host,
            port=args.port,
            bookmark_interval=args.bookmark_interval,
            history_size=args.history_size,
            admin_port=args.admin_port,
            kubelet=args.kubelet,
            kubelet_delay=args.kubelet_delay,
            kubelet_addresses=args.kubelet_ips,
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
            where = [f"admin: {sim.admin_url}"] if sim.admin_url is not None else []
            if kubeconfig_out is not None:
                where.append(f"kubeconfig: {kubeconfig_out}")
            detail = f" ({', '.join(where)})" if where else ""
            print(f"sim-apiserver serving {sim.url}{detail}", flush=True)
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
