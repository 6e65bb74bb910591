"""The `headcount serve` command line: every flag, its default from the settings, its field.

`add_serve_arguments` declares the flags (their defaults read from the settings
dataclasses in `config.py`, so each lives once) and `settings_from_args` maps
them to a `Settings`, whose own checks raise `ConfigError` naming the flag.
Durations accept fractional seconds and units (`250ms`, `2m`); sizes accept
`32MiB`.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from headcount.config import (
    AuthSettings,
    DiscoveryMode,
    DiscoverySettings,
    DnsSettings,
    HealthSettings,
    KvEventsSettings,
    LogFormat,
    OutlierSettings,
    ProbeSettings,
    ProxySettings,
    ServerSettings,
    Settings,
)
from headcount.routing import RoutingName

__all__ = ["add_serve_arguments", "parse_duration", "settings_from_args"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_FACTOR = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_duration(text: str) -> float:
    """Seconds from `1.5`, `1.5s`, `250ms`, `2m` or `1h`."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use seconds such as 2, 0.5, 250ms, 2m"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _parse_size(text: str) -> int:
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use bytes such as 1048576, 32MiB")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * _SIZE_FACTOR[unit]


def _parse_port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: use 0-65535")
    return port


def _split_backends(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every `headcount serve` flag (DESIGN.md §3 is the contract)."""
    server_d, proxy_d, probe_d = ServerSettings(), ProxySettings(), ProbeSettings()
    discovery_d, health_d = DiscoverySettings(), HealthSettings()
    outlier_d, dns_d = OutlierSettings(), DnsSettings()
    server = parser.add_argument_group("server")
    server.add_argument("--host", default=server_d.host)
    server.add_argument("--port", type=_parse_port, default=server_d.port)
    server.add_argument("--grpc-health-port", type=_parse_port, default=server_d.grpc_health_port)
    server.add_argument(
        "--log-format", choices=[f.value for f in LogFormat], default=server_d.log_format.value
    )
    server.add_argument("--log-level", default=server_d.log_level)
    server.add_argument("--admin-port", type=_parse_port, default=server_d.admin_port)

    discovery = parser.add_argument_group("discovery")
    discovery.add_argument(
        "--discovery", choices=[m.value for m in DiscoveryMode], default=discovery_d.mode.value
    )
    discovery.add_argument(
        "--backends", type=_split_backends, default=discovery_d.backends, help="URL,URL,..."
    )
    discovery.add_argument("--kubeconfig", type=Path, default=discovery_d.kubeconfig)
    discovery.add_argument("--namespace", default=discovery_d.namespace)
    discovery.add_argument("--label-selector", default=discovery_d.label_selector)
    discovery.add_argument("--engine-port", type=_parse_port, default=discovery_d.engine_port)
    for flag, default in (
        ("--watch-idle-timeout", discovery_d.watch_idle_timeout),
        ("--watch-timeout-min", discovery_d.watch_timeout_min),
        ("--watch-timeout-max", discovery_d.watch_timeout_max),
        ("--api-request-timeout", discovery_d.request_timeout),
        ("--api-connect-timeout", discovery_d.connect_timeout),
        ("--backoff-initial", discovery_d.backoff_initial),
        ("--backoff-max", discovery_d.backoff_max),
    ):
        discovery.add_argument(flag, type=parse_duration, default=default)

    proxy = parser.add_argument_group("routing and proxy")
    proxy.add_argument(
        "--routing", choices=[r.value for r in RoutingName], default=proxy_d.routing.value
    )
    proxy.add_argument("--connect-timeout", type=parse_duration, default=proxy_d.connect_timeout)
    proxy.add_argument("--read-timeout", type=parse_duration, default=proxy_d.read_timeout)
    proxy.add_argument("--max-failovers", type=int, default=proxy_d.max_failovers)
    proxy.add_argument("--max-body-size", type=_parse_size, default=proxy_d.max_body_size)
    proxy.add_argument(
        "--max-buffered-body-bytes", type=_parse_size, default=proxy_d.max_buffered_body_bytes
    )
    proxy.add_argument("--max-connections", type=int, default=proxy_d.max_connections)
    for flag, default in (
        ("--client-idle-timeout", proxy_d.client_idle_timeout),
        ("--client-header-timeout", proxy_d.client_header_timeout),
        ("--client-send-timeout", proxy_d.client_send_timeout),
    ):
        proxy.add_argument(flag, type=parse_duration, default=default)
    proxy.add_argument(
        "--first-byte-timeout", type=parse_duration, default=proxy_d.first_byte_timeout
    )
    proxy.add_argument("--dns-timeout", type=parse_duration, default=dns_d.timeout)
    proxy.add_argument("--access-log-sample", type=float, default=proxy_d.access_log_sample)

    outlier = parser.add_argument_group("outlier detection")
    outlier.add_argument(
        "--outlier-consecutive-errors", type=int, default=outlier_d.consecutive_errors
    )
    for flag, default in (
        ("--outlier-base-ejection", outlier_d.base_ejection),
        ("--outlier-max-ejection", outlier_d.max_ejection),
    ):
        outlier.add_argument(flag, type=parse_duration, default=default)
    outlier.add_argument(
        "--outlier-max-ejected-percent", type=float, default=outlier_d.max_ejected_percent
    )

    probe = parser.add_argument_group("engine probes")
    probe.add_argument("--probe-interval", type=parse_duration, default=probe_d.interval)
    probe.add_argument("--probe-timeout", type=parse_duration, default=probe_d.timeout)
    probe.add_argument("--probe-concurrency", type=int, default=probe_d.concurrency)
    probe.add_argument("--unhealthy-after", type=int, default=probe_d.unhealthy_after)
    probe.add_argument("--probe-max-bytes", type=_parse_size, default=probe_d.max_bytes)
    probe.add_argument("--probe-max-models", type=int, default=probe_d.max_models)

    health = parser.add_argument_group("health and shutdown")
    for flag, default in (
        ("--discovery-stale-after", health_d.discovery_stale_after),
        ("--discovery-dead-after", health_d.discovery_dead_after),
        ("--drain-delay", health_d.drain_delay),
        ("--drain-timeout", health_d.drain_timeout),
    ):
        health.add_argument(flag, type=parse_duration, default=default)
    health.add_argument(
        "--ready-requires-engines", action="store_true", default=health_d.ready_requires_engines
    )
    health.add_argument(
        "--ready-requires-fresh", action="store_true", default=health_d.ready_requires_fresh
    )

    _add_kv_arguments(parser)

    auth_d = AuthSettings()
    auth = parser.add_argument_group("authentication")
    auth.add_argument("--api-keys-file", type=Path, default=auth_d.api_keys_file)
    auth.add_argument("--engine-api-key-file", type=Path, default=auth_d.engine_api_key_file)


def _add_kv_arguments(parser: argparse.ArgumentParser) -> None:
    kv_d = KvEventsSettings()
    kv = parser.add_argument_group(
        "kv-aware routing", "Read only with --routing kv-aware: the engines' KV-event streams."
    )
    kv.add_argument(
        "--kv-events-port",
        type=_parse_port,
        default=kv_d.port,
        help="port of each engine's KV-event publisher (vLLM's endpoint); the pod or Service "
        "annotation kv-events-port overrides it (default %(default)s)",
    )
    kv.add_argument(
        "--kv-events-replay-port",
        type=_parse_port,
        default=kv_d.replay_port,
        help="port of each engine's replay socket (vLLM's replay_endpoint); annotation "
        "kv-events-replay-port (default %(default)s)",
    )
    kv.add_argument(
        "--kv-events-topic",
        default=kv_d.topic,
        help="topic prefix subscribed to, vLLM's `topic` (default empty: every topic)",
    )
    kv.add_argument(
        "--kv-events-idle-timeout",
        type=parse_duration,
        default=kv_d.idle_timeout,
        help="an engine we route to that sends no event for this long has a stale index "
        "(seconds or 250ms, 2m; default %(default)gs)",
    )
    kv.add_argument(
        "--kv-events-replay-timeout",
        type=parse_duration,
        default=kv_d.replay_timeout,
        help="a gap's replay must answer within this, else the index is cleared and rebuilt "
        "(default %(default)gs)",
    )
    kv.add_argument(
        "--tokenizer",
        metavar="DIR|builtin",
        default=kv_d.tokenizer,
        help="tokenizer and chat template of the served model: a Hugging Face directory "
        "(tokenizer.json, tokenizer_config.json), or builtin (the simulated engine's); "
        "default: ask each engine's POST /tokenize",
    )
    kv.add_argument(
        "--tokenize-timeout",
        type=parse_duration,
        default=kv_d.tokenize_timeout,
        help="an engine's /tokenize answering later is skipped and the request routed by load "
        "(default %(default)gs)",
    )


def settings_from_args(ns: argparse.Namespace) -> Settings:
    """Map the parsed flags to `Settings`, which validate themselves (`ConfigError`)."""
    return Settings(
        # built first so that, of several bad flags, a discovery one is reported, as before
        discovery=DiscoverySettings(
            mode=DiscoveryMode(ns.discovery),
            backends=ns.backends,
            kubeconfig=ns.kubeconfig,
            namespace=ns.namespace,
            label_selector=ns.label_selector,
            engine_port=ns.engine_port,
            watch_idle_timeout=ns.watch_idle_timeout,
            watch_timeout_min=ns.watch_timeout_min,
            watch_timeout_max=ns.watch_timeout_max,
            request_timeout=ns.api_request_timeout,
            connect_timeout=ns.api_connect_timeout,
            backoff_initial=ns.backoff_initial,
            backoff_max=ns.backoff_max,
        ),
        server=ServerSettings(
            host=ns.host,
            port=ns.port,
            grpc_health_port=ns.grpc_health_port,
            log_format=LogFormat(ns.log_format),
            log_level=ns.log_level.upper(),
            admin_port=ns.admin_port,
        ),
        proxy=ProxySettings(
            routing=RoutingName(ns.routing),
            connect_timeout=ns.connect_timeout,
            read_timeout=ns.read_timeout,
            max_failovers=ns.max_failovers,
            max_body_size=ns.max_body_size,
            max_buffered_body_bytes=ns.max_buffered_body_bytes,
            max_connections=ns.max_connections,
            client_idle_timeout=ns.client_idle_timeout,
            client_header_timeout=ns.client_header_timeout,
            client_send_timeout=ns.client_send_timeout,
            first_byte_timeout=ns.first_byte_timeout,
            access_log_sample=ns.access_log_sample,
        ),
        probe=ProbeSettings(
            interval=ns.probe_interval,
            timeout=ns.probe_timeout,
            concurrency=ns.probe_concurrency,
            unhealthy_after=ns.unhealthy_after,
            max_bytes=ns.probe_max_bytes,
            max_models=ns.probe_max_models,
        ),
        health=HealthSettings(
            discovery_stale_after=ns.discovery_stale_after,
            discovery_dead_after=ns.discovery_dead_after,
            ready_requires_engines=ns.ready_requires_engines,
            ready_requires_fresh=ns.ready_requires_fresh,
            drain_delay=ns.drain_delay,
            drain_timeout=ns.drain_timeout,
        ),
        auth=AuthSettings(
            api_keys_file=ns.api_keys_file, engine_api_key_file=ns.engine_api_key_file
        ),
        outlier=OutlierSettings(
            consecutive_errors=ns.outlier_consecutive_errors,
            base_ejection=ns.outlier_base_ejection,
            max_ejection=ns.outlier_max_ejection,
            max_ejected_percent=ns.outlier_max_ejected_percent,
        ),
        dns=DnsSettings(timeout=ns.dns_timeout),
        kv_events=KvEventsSettings(
            port=ns.kv_events_port,
            replay_port=ns.kv_events_replay_port,
            topic=ns.kv_events_topic,
            idle_timeout=ns.kv_events_idle_timeout,
            replay_timeout=ns.kv_events_replay_timeout,
            tokenizer=ns.tokenizer,
            tokenize_timeout=ns.tokenize_timeout,
        ),
    )
