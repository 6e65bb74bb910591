"""The engine as a program: ``headcount sim-engine`` and ``python -m headcount.sim.engine``.

Benchmarks run engines as separate processes, so an engine's work never
shares the router's process or event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import uvloop

from headcount.config import ConfigError
from headcount.flags.parser import CommandParser, cannot_listen, fail, field_error, lowercase
from headcount.flags.values import add_listen_arguments
from headcount.sim.engine.config import FAIL_MODES, EngineSimConfig
from headcount.sim.engine.kv_events_config import add_kv_events_arguments, kv_events_from_args
from headcount.sim.engine.server import running_engine

__all__ = ["add_arguments", "config_from_args", "main", "serve_forever", "serve_until_signalled"]

N = TypeVar("N", int, float)

_DESCRIPTION = (
    "A vLLM-like inference engine on loopback, so tests, the demo and benchmarks need no GPU."
)


async def serve_forever(config: EngineSimConfig) -> None:
    """Run an engine until cancelled, announcing its URL on stdout once it listens.

    A port that cannot be bound is a `ConfigError` saying so in one line."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            engine = await stack.enter_async_context(running_engine(config))
        except OSError as exc:
            raise cannot_listen(config.host, config.port, exc) from None
        sys.stdout.write(f"sim-engine {engine.name} listening on {engine.url}\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().create_future()


def _adapter_list(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in value.split(",") if name.strip())


def _tokenizer_dir(value: str) -> str:
    if not (Path(value) / "tokenizer.json").is_file():
        raise argparse.ArgumentTypeError(f"{value} holds no tokenizer.json")
    return value


def _above(kind: Callable[[str], N], low: N) -> Callable[[str], N]:
    """`kind` parsed, and more than `low`."""

    def parse(value: str) -> N:
        number = kind(value)
        if not number > low:
            raise argparse.ArgumentTypeError(f"must be more than {low}, not {value}")
        return number

    return parse


def _at_least_zero(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine simulator's command-line options, defaults from `EngineSimConfig`."""
    defaults = EngineSimConfig()
    add_listen_arguments(parser, defaults.host, defaults.port)
    parser.add_argument(
        "--model", default=defaults.model, help=f"base model name served (default {defaults.model})"
    )
    parser.add_argument(
        "--adapters",
        type=_adapter_list,
        default=defaults.adapters,
        metavar="A,B,...",
        help="LoRA adapters served besides the model (default: none)",
    )
    parser.add_argument(
        "--token-delay",
        type=float,
        default=defaults.token_delay,
        help="seconds per output token, the first included; ~0.01 for an 8B model on one H100 "
        f"(default {defaults.token_delay:g}: instant)",
    )
    parser.add_argument(
        "--fail-mode",
        type=lowercase,
        choices=FAIL_MODES,
        default=defaults.fail_mode,
        help="how the engine misbehaves, changed at run time by POST /sim/fail-mode: "
        "refuse (connects get ECONNREFUSED), hang (nothing answers), stall (generation "
        "stops, probes answer), die-mid-stream (streams reset after --die-after-chunks "
        "chunks, whole answers instead of being sent), truncate-mid-stream (half the "
        "next chunk, then FIN with no last HTTP chunk; half a whole answer), "
        "stall-mid-stream (streams send nothing more until the mode changes, all else "
        f"answers), http-500 (the API answers 500) (default {defaults.fail_mode})",
    )
    parser.add_argument(
        "--die-after-chunks",
        type=_at_least_zero,
        default=defaults.die_after_chunks,
        metavar="N",
        help="chunks a stream sends before a *-mid-stream fail mode breaks it "
        f"(default {defaults.die_after_chunks})",
    )
    parser.add_argument(
        "--max-running",
        type=int,
        default=defaults.max_running,
        help="requests running at once, vLLM's --max-num-seqs; more wait first come first "
        "served and count in vllm:num_requests_waiting (default: no limit)",
    )
    parser.add_argument(
        "--name", default=defaults.name, help="name in logs and answers (default: host:port)"
    )
    parser.add_argument(
        "--legacy-metrics",
        action="store_true",
        help="expose vllm:gpu_cache_usage_perc instead of vllm:kv_cache_usage_perc (default: off)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=defaults.max_model_len,
        help=f"longest prompt plus answer, in tokens, as vLLM's (default {defaults.max_model_len})",
    )
    parser.add_argument(
        "--api-key",
        default=defaults.api_key,
        help="as vLLM's: /v1/ requests need `Authorization: Bearer KEY` (default: open)",
    )
    parser.add_argument(
        "--tokenizer",
        type=_tokenizer_dir,
        default=defaults.tokenizer,
        metavar="DIR",
        help="a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json with "
        "the chat template) (default: the built-in tokenizer and ChatML template)",
    )
    parser.add_argument(
        "--kv-blocks",
        type=_above(int, 1),
        default=defaults.kv_blocks,
        metavar="N",
        help="simulate a prefix cache of N KV blocks (vLLM's num_gpu_blocks, the null block "
        "included) and prefill time; an 8B model on one H100 holds ~28000 (default: off)",
    )
    parser.add_argument(
        "--block-size",
        type=_above(int, 0),
        default=defaults.block_size,
        help=f"tokens per KV block (default {defaults.block_size})",
    )
    parser.add_argument(
        "--prefill-tokens-per-s",
        type=_above(float, 0.0),
        default=defaults.prefill_tokens_per_s,
        help="uncached prompt tokens prefilled per second, shared first come first served, "
        f"with --kv-blocks; an 8B model on one H100 (default {defaults.prefill_tokens_per_s:g})",
    )
    for flag, what in (
        ("--tls-cert", "PEM certificate chain: serve https, as vLLM's --ssl-certfile"),
        ("--tls-key", "PEM key of --tls-cert, as vLLM's --ssl-keyfile"),
        ("--tls-client-ca", "PEM CAs a required client certificate must chain to"),
    ):
        parser.add_argument(flag, metavar="FILE", help=f"{what} (default: off)")
    add_kv_events_arguments(parser)


def config_from_args(ns: argparse.Namespace) -> EngineSimConfig:
    """The config that `add_arguments`' parsed options describe; `ConfigError` names the flag."""
    try:
        return _config(ns)
    except ValueError as exc:
        raise field_error(exc) from None


def _config(ns: argparse.Namespace) -> EngineSimConfig:
    return EngineSimConfig(
        host=ns.host,
        port=ns.port,
        model=ns.model,
        adapters=tuple(ns.adapters),
        token_delay=ns.token_delay,
        fail_mode=ns.fail_mode,
        die_after_chunks=ns.die_after_chunks,
        max_running=ns.max_running,
        name=ns.name,
        legacy_metrics=ns.legacy_metrics,
        max_model_len=ns.max_model_len,
        api_key=ns.api_key,
        tokenizer=ns.tokenizer,
        kv_blocks=ns.kv_blocks,
        block_size=ns.block_size,
        prefill_tokens_per_s=ns.prefill_tokens_per_s,
        kv_events=kv_events_from_args(ns),
        tls_cert=ns.tls_cert,
        tls_key=ns.tls_key,
        tls_client_ca=ns.tls_client_ca,
    )


async def serve_until_signalled(config: EngineSimConfig) -> None:
    """`serve_forever` until SIGINT or SIGTERM, then return cleanly."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await serve_forever(config)


def main(argv: list[str] | None = None) -> None:
    """``python -m headcount.sim.engine``: serve on uvloop until signalled."""
    parser = CommandParser(prog="python -m headcount.sim.engine", description=_DESCRIPTION)
    add_arguments(parser)
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    try:
        config = config_from_args(parser.parse(argv))
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve_until_signalled(config))
    except ConfigError as exc:
        fail(parser.prog, str(exc))
