"""Whether and how a simulated engine publishes vLLM's KV events: its settings and their flags.

Off unless `--kv-events-port` is given, so engines without it behave as
before. The defaults are vLLM's (`KVEventsConfig`), except the topic, which
is `kv-events` here and empty in vLLM; vllm-router only applies messages
whose topic is empty, so point it at engines started with `--kv-events-topic ""`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from headcount.config import ConfigError
from headcount.kvevents import LAYOUTS, Layout

__all__ = ["KvEventsConfig", "add_kv_events_arguments", "kv_events_from_args"]

_PORTS = range(65536)


@dataclass(frozen=True)
class KvEventsConfig:
    """Where an engine publishes its KV events, in which layout, and what it keeps for replay."""

    port: int
    """The PUB socket's TCP port on the engine's host; 0 picks a free one."""
    replay_port: int | None = None
    """The replay ROUTER socket's port (0 picks a free one); None: no replay, as in vLLM."""
    layout: Layout = "current"
    topic: str = "kv-events"
    buffer_steps: int = 10_000
    """Batches kept for replay, oldest dropped first (vLLM's `buffer_steps`)."""

    def __post_init__(self) -> None:
        if self.port not in _PORTS or (
            self.replay_port is not None and self.replay_port not in _PORTS
        ):
            raise ValueError("KV-event ports must be in 0..65535")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}")
        if self.buffer_steps < 0:
            raise ValueError("buffer_steps must be >= 0")


def add_kv_events_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--kv-events-*` options; `kv_events_from_args` reads them back."""
    default = KvEventsConfig(port=0)
    parser.add_argument(
        "--kv-events-port",
        type=int,
        metavar="PORT",
        help="publish vLLM's KV-cache events on a ZMQ PUB socket on tcp://HOST:PORT "
        "(0: a free port; default: off)",
    )
    parser.add_argument(
        "--kv-events-replay-port",
        type=int,
        metavar="PORT",
        help="serve past event batches to subscribers that missed some, on a ZMQ ROUTER "
        "socket on this port (0: a free port; default: no replay, as vLLM)",
    )
    parser.add_argument(
        "--kv-events-format",
        type=str.lower,
        choices=LAYOUTS,
        help="wire layout: 0.10 (vLLM <= 0.10: events as tagged arrays, signed int hashes) "
        f"or current (events as maps, unsigned 64-bit hashes) (default: {default.layout})",
    )
    parser.add_argument(
        "--kv-events-topic",
        metavar="TOPIC",
        help=f"first frame of every message (default: {default.topic}; vLLM's own default "
        'and what vllm-router needs is "")',
    )
    parser.add_argument(
        "--kv-events-buffer-steps",
        type=int,
        metavar="N",
        help=f"batches kept for replay (default: {default.buffer_steps}, as vLLM)",
    )


def kv_events_from_args(ns: argparse.Namespace) -> KvEventsConfig | None:
    """The settings the `--kv-events-*` options describe; None when publishing is off."""
    others = {
        "--kv-events-replay-port": ns.kv_events_replay_port,
        "--kv-events-format": ns.kv_events_format,
        "--kv-events-topic": ns.kv_events_topic,
        "--kv-events-buffer-steps": ns.kv_events_buffer_steps,
    }
    given = {flag: value for flag, value in others.items() if value is not None}
    if ns.kv_events_port is None:
        if given:
            raise ConfigError(f"{', '.join(given)} needs --kv-events-port")
        return None
    default = KvEventsConfig(port=0)
    try:
        return KvEventsConfig(
            port=ns.kv_events_port,
            replay_port=ns.kv_events_replay_port,
            layout=ns.kv_events_format or default.layout,
            topic=default.topic if ns.kv_events_topic is None else ns.kv_events_topic,
            buffer_steps=(
                default.buffer_steps
                if ns.kv_events_buffer_steps is None
                else ns.kv_events_buffer_steps
            ),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
