"""The `headcount serve` command line: every flag, its default from the settings, its field.

`add_serve_arguments` declares the flags (their defaults read from the settings
dataclasses in `config.py`, so each lives once) and `settings_from_args` maps
them to a `Settings`, whose own checks raise `ConfigError` naming the flag.
Durations accept fractional seconds and units (`250ms`, `2m`); sizes accept
`32MiB` (`flags/values.py`). Every flag's help gives its default and unit; choices
take any case. Over 450 lines because each flag carries its one-line help:
one table of every flag reads better whole than split by group.
"""

from __future__ import annotations

import argparse
import enum
from pathlib import Path

from headcount.config import (
    CLIENT_SHARE_OF_FILES,
    LOG_LEVELS,
    AuthSettings,
    DiscoveryMode,
    DiscoverySettings,
    DnsSettings,
    EngineScheme,
    EngineTlsSettings,
    FlowSettings,
    HealthSettings,
    KvEventsSettings,
    LogFormat,
    OutlierSettings,
    ProbeSettings,
    ProxySettings,
    RoutingName,
    ServerSettings,
    Settings,
)
from headcount.flags.cgroup import (
    BUFFERED_SHARE_OF_MEMORY,
    CGROUP_ROOT,
    buffered_body_default,
    memory_limit,
)
from headcount.flags.parser import lowercase, uppercase
from headcount.flags.values import (
    duration_help,
    format_size,
    parse_duration,
    parse_port,
    parse_size,
)

__all__ = ["add_serve_arguments", "parse_duration", "settings_from_args"]


def _split_backends(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_serve_arguments(parser: argparse.ArgumentParser, cgroup: Path = CGROUP_ROOT) -> None:
    """Declare every `headcount serve` flag, each with a one-line help giving its default.

    Memory bounds default to a share of the memory limit of the cgroup under `cgroup`.
    """
    server_d, proxy_d, probe_d = ServerSettings(), ProxySettings(), ProbeSettings()
    discovery_d, health_d = DiscoverySettings(), HealthSettings()
    outlier_d, dns_d = OutlierSettings(), DnsSettings()
    server = parser.add_argument_group("server")
    server.add_argument(
        "--host", default=server_d.host, help=f"address to listen on (default {server_d.host})"
    )
    server.add_argument(
        "--port",
        type=_port_or_off,
        default=server_d.port,
        help="port of the OpenAI API, and of health and metrics unless --admin-port; off: "
        f"none, an endpoint picker only (needs --ext-proc-port, --admin-port) "
        f"(default {server_d.port})",
    )
    server.add_argument(
        "--ext-proc-port",
        type=parse_port,
        default=server_d.ext_proc_port,
        help="be a gateway's endpoint picker: Envoy's ext_proc gRPC service (and grpc.health.v1) "
        "on this port, 0 any free one (default: off)",
    )
    server.add_argument(
        "--ext-proc-tls-cert",
        type=Path,
        default=server_d.ext_proc_tls_cert,
        metavar="FILE",
        help="PEM certificate chain: TLS on --ext-proc-port (default: off, h2c)",
    )
    server.add_argument(
        "--ext-proc-tls-key",
        type=Path,
        default=server_d.ext_proc_tls_key,
        metavar="FILE",
        help="PEM private key of --ext-proc-tls-cert (default: off)",
    )
    server.add_argument(
        "--ext-proc-fallbacks",
        type=int,
        default=server_d.ext_proc_fallbacks,
        metavar="N",
        help="name N more endpoints after the one picked, for the gateway to retry on "
        f"(default {server_d.ext_proc_fallbacks}: Envoy's ORIGINAL_DST reads one address)",
    )
    server.add_argument(
        "--grpc-health-port",
        type=parse_port,
        default=server_d.grpc_health_port,
        help="serve grpc.health.v1 on this port (default: off)",
    )
    server.add_argument(
        "--log-format",
        type=lowercase,
        choices=[f.value for f in LogFormat],
        default=server_d.log_format.value,
        help=f"text for people, json for log pipelines (default {server_d.log_format.value})",
    )
    server.add_argument(
        "--log-level",
        type=uppercase,
        choices=LOG_LEVELS,
        default=server_d.log_level,
        help=f"least severe level logged, any case (default {server_d.log_level})",
    )
    server.add_argument(
        "--admin-port",
        type=parse_port,
        default=server_d.admin_port,
        help="health, /engines and /metrics on this port instead, without API key "
        "(default: off, all on --port)",
    )

    discovery = parser.add_argument_group("discovery")
    discovery.add_argument(
        "--discovery",
        type=lowercase,
        choices=[m.value for m in DiscoveryMode],
        default=discovery_d.mode.value,
        help="where engines are found: a fixed --backends list, or Pods or Services watched "
        f"in Kubernetes (default {discovery_d.mode.value})",
    )
    discovery.add_argument(
        "--backends",
        type=_split_backends,
        default=discovery_d.backends,
        metavar="URL,URL,...",
        help="static: the engines, http://host:port or https://host:port each, without /v1 "
        "(default: none)",
    )
    discovery.add_argument(
        "--kubeconfig",
        type=Path,
        default=discovery_d.kubeconfig,
        help="Kubernetes modes: the cluster's kubeconfig "
        "(default: in-cluster, then $KUBECONFIG, then ~/.kube/config)",
    )
    discovery.add_argument(
        "--namespace",
        default=discovery_d.namespace,
        help="Kubernetes modes: namespace watched "
        "(default: the router pod's own, else the kubeconfig context's)",
    )
    discovery.add_argument(
        "--label-selector",
        default=discovery_d.label_selector,
        help="Kubernetes modes: which Pods or Services are engines, as kubectl -l "
        "(default: all of them)",
    )
    discovery.add_argument(
        "--inference-pool",
        default=discovery_d.inference_pool,
        metavar="NAME",
        help="inference-pool: the InferencePool (inference.networking.k8s.io/v1) in --namespace "
        "whose selector and targetPorts say which pods are engines (default: none; "
        "required in that mode)",
    )
    discovery.add_argument(
        "--engine-port",
        type=parse_port,
        default=discovery_d.engine_port,
        help=f"Kubernetes modes: the engines' HTTP port (default {discovery_d.engine_port})",
    )
    discovery.add_argument(
        "--engine-scheme",
        type=lowercase,
        choices=[s.value for s in EngineScheme],
        default=discovery_d.engine_scheme.value,
        help="Kubernetes modes: https for engines that terminate TLS themselves; a Service "
        "port named https or with appProtocol https is https anyway "
        f"(default {discovery_d.engine_scheme.value})",
    )
    for flag, default, what in (
        (
            "--watch-idle-timeout",
            discovery_d.watch_idle_timeout,
            "a watch silent this long (no event, no bookmark) is dead and reopened",
        ),
        ("--watch-timeout-min", discovery_d.watch_timeout_min, "server-side watch timeout, least"),
        ("--watch-timeout-max", discovery_d.watch_timeout_max, "server-side watch timeout, most"),
        (
            "--api-request-timeout",
            discovery_d.request_timeout,
            "bound on one LIST, connect and whole answer",
        ),
        ("--api-connect-timeout", discovery_d.connect_timeout, "connect to the API server"),
        ("--backoff-initial", discovery_d.backoff_initial, "first wait before reconnecting"),
        ("--backoff-max", discovery_d.backoff_max, "longest wait before reconnecting"),
    ):
        discovery.add_argument(
            flag, type=parse_duration, default=default, help=duration_help(what, default)
        )

    proxy = parser.add_argument_group("routing and proxy")
    proxy.add_argument(
        "--routing",
        type=lowercase,
        choices=[r.value for r in RoutingName],
        default=proxy_d.routing.value,
        help=f"how an engine is chosen among those serving the model "
        f"(default {proxy_d.routing.value})",
    )
    for flag, default, what in (
        ("--connect-timeout", proxy_d.connect_timeout, "connect to an engine, then fail over"),
        ("--read-timeout", proxy_d.read_timeout, "longest silence inside an engine's answer"),
    ):
        proxy.add_argument(
            flag, type=parse_duration, default=default, help=duration_help(what, default)
        )
    proxy.add_argument(
        "--max-failovers",
        type=int,
        default=proxy_d.max_failovers,
        help="other engines tried when one fails before its first response byte "
        f"(default {proxy_d.max_failovers})",
    )
    proxy.add_argument(
        "--stream-resume-limit",
        type=int,
        default=proxy_d.stream_resume_limit,
        help="times a stream whose engine fails mid-answer is continued on another engine "
        "from the text already sent; a rolling update can move a long answer twice, a "
        "request that breaks every engine it reaches stops after three; 0: off "
        f"(default {proxy_d.stream_resume_limit})",
    )
    proxy.add_argument(
        "--no-passthrough",
        action="store_true",
        default=not proxy_d.passthrough,
        help="answer 404 for a POST /v1/... path the router does not know by name, instead of "
        "routing it by its body's model (default: off, routed)",
    )
    proxy.add_argument(
        "--max-body-size",
        type=parse_size,
        default=proxy_d.max_body_size,
        help=f"larger request bodies get 413; bytes, or 64KiB, 32MiB "
        f"(default {format_size(proxy_d.max_body_size)})",
    )
    buffered = buffered_body_default(
        memory_limit(cgroup), proxy_d.max_buffered_body_bytes, proxy_d.max_body_size
    )
    proxy.add_argument(
        "--max-buffered-body-bytes",
        type=parse_size,
        default=buffered,
        help="request bodies held across all clients; past it 503 overloaded; by default "
        f"{BUFFERED_SHARE_OF_MEMORY * 100:.0f}%% of the container's memory limit (its cgroup's), "
        f"{format_size(proxy_d.max_buffered_body_bytes)} without one "
        f"(default {format_size(buffered)})",
    )
    proxy.add_argument(
        "--max-connections",
        type=int,
        default=proxy_d.max_connections,
        help="client connections open at once; one more gets 503 "
        f"(default: {CLIENT_SHARE_OF_FILES * 100:.0f}%% of the open-file limit)",
    )
    for flag, default, what in (
        ("--client-idle-timeout", proxy_d.client_idle_timeout, "idle client connections close"),
        (
            "--client-header-timeout",
            proxy_d.client_header_timeout,
            "a request head must arrive whole within this, else 408",
        ),
        (
            "--client-send-timeout",
            proxy_d.client_send_timeout,
            "a client reading nothing of its answer this long is disconnected",
        ),
    ):
        proxy.add_argument(
            flag, type=parse_duration, default=default, help=duration_help(what, default)
        )
    proxy.add_argument(
        "--first-byte-timeout",
        type=parse_duration,
        default=proxy_d.first_byte_timeout,
        help="no response byte within this: fail over; seconds or 250ms, 2m "
        "(default: off, a long prefill may take minutes)",
    )
    proxy.add_argument(
        "--stalled-engine-timeout",
        type=parse_duration,
        default=proxy_d.stalled_engine_timeout,
        help="a request waited this for its first byte from an engine that sent none to any "
        "request meanwhile: it fails over and the engine is ejected; 0: off "
        f"(default {proxy_d.stalled_engine_timeout:g}s)",
    )
    proxy.add_argument(
        "--dns-timeout",
        type=parse_duration,
        default=dns_d.timeout,
        help=duration_help(
            "one lookup of an engine's host name, under --probe-timeout", dns_d.timeout
        ),
    )
    proxy.add_argument(
        "--resolve",
        type=_pinned_names,
        default=(),
        metavar="NAME=ADDRESS[,...]",
        help="answer these engine host names with these addresses, never looking them up, "
        "e.g. a Service name of a cluster tried locally (default: none)",
    )
    proxy.add_argument(
        "--access-log-sample",
        type=float,
        default=proxy_d.access_log_sample,
        help="share of successful requests given an access-log line; 5xx, cut streams and "
        "failovers always get one; 0: off, 1: every request "
        f"(default {proxy_d.access_log_sample:g})",
    )

    outlier = parser.add_argument_group("outlier detection")
    outlier.add_argument(
        "--outlier-consecutive-errors",
        type=int,
        default=outlier_d.consecutive_errors,
        help="failed requests in a row that eject an engine, 0: off "
        f"(default {outlier_d.consecutive_errors})",
    )
    for flag, default, what in (
        ("--outlier-base-ejection", outlier_d.base_ejection, "ejection length, times its count"),
        ("--outlier-max-ejection", outlier_d.max_ejection, "longest ejection"),
    ):
        outlier.add_argument(
            flag, type=parse_duration, default=default, help=duration_help(what, default)
        )
    outlier.add_argument(
        "--outlier-max-ejected-percent",
        type=float,
        default=outlier_d.max_ejected_percent,
        help="past this share of a model's engines ejected, route to all of them, in percent "
        f"(default {outlier_d.max_ejected_percent:g})",
    )

    probe = parser.add_argument_group("engine probes")
    for flag, default, what in (
        (
            "--probe-interval",
            probe_d.interval,
            "how often each engine's /v1/models and /metrics are read",
        ),
        ("--probe-timeout", probe_d.timeout, "one probe request"),
    ):
        probe.add_argument(
            flag, type=parse_duration, default=default, help=duration_help(what, default)
        )
    probe.add_argument(
        "--probe-concurrency",
        type=int,
        default=probe_d.concurrency,
        help=f"probes in flight at once (default {probe_d.concurrency})",
    )
    probe.add_argument(
        "--unhealthy-after",
        type=int,
        default=probe_d.unhealthy_after,
        help="failed probes in a row before an engine leaves rotation "
        f"(default {probe_d.unhealthy_after})",
    )
    probe.add_argument(
        "--probe-max-bytes",
        type=parse_size,
        default=probe_d.max_bytes,
        help=f"largest probe answer read (default {format_size(probe_d.max_bytes)})",
    )
    probe.add_argument(
        "--probe-max-models",
        type=int,
        default=probe_d.max_models,
        help=f"model cards kept per engine (default {probe_d.max_models})",
    )

    health = parser.add_argument_group("health and shutdown")
    for flag, default, what in (
        (
            "--discovery-stale-after",
            health_d.discovery_stale_after,
            "discovery older than this makes /health degraded",
        ),
        (
            "--discovery-dead-after",
            health_d.discovery_dead_after,
            "no discovery round finished this long fails /livez",
        ),
        ("--drain-delay", health_d.drain_delay, "after SIGTERM, new requests still served"),
        ("--drain-timeout", health_d.drain_timeout, "then in-flight requests awaited at most"),
    ):
        health.add_argument(
            flag, type=parse_duration, default=default, help=duration_help(what, default)
        )
    health.add_argument(
        "--ready-requires-engines",
        action="store_true",
        default=health_d.ready_requires_engines,
        help="/readyz fails while no engine is routable (default: off, 503 answers say why)",
    )
    health.add_argument(
        "--ready-requires-fresh",
        action="store_true",
        default=health_d.ready_requires_fresh,
        help="/readyz fails while discovery is stale (default: off)",
    )

    _add_kv_arguments(parser)
    _add_engine_tls_arguments(parser)

    auth_d = AuthSettings()
    auth = parser.add_argument_group("authentication")
    auth.add_argument(
        "--api-keys-file",
        type=Path,
        default=auth_d.api_keys_file,
        help="clients need Authorization: Bearer with a key from this file, one a line "
        "(default: off, open)",
    )
    auth.add_argument(
        "--engine-api-key-file",
        type=Path,
        default=auth_d.engine_api_key_file,
        help="the key engines expect (vLLM's --api-key), sent on probes and requests "
        "(default: off)",
    )
    auth.add_argument(
        "--tenants-file",
        type=Path,
        default=auth_d.tenants_file,
        help="TOML of tenants: their keys (which authenticate like --api-keys-file's), "
        "priority, weight and limits; turns flow control on (default: off)",
    )
    _add_flow_arguments(parser)


def _add_engine_tls_arguments(parser: argparse.ArgumentParser) -> None:
    tls_d = EngineTlsSettings()
    tls = parser.add_argument_group(
        "engine TLS", "Read only for https engines; certificates are verified by default."
    )
    tls.add_argument(
        "--engine-tls-ca-file",
        type=Path,
        default=tls_d.ca_file,
        help="PEM bundle of the CAs engine certificates are checked against "
        "(default: the system's)",
    )
    tls.add_argument(
        "--engine-tls-cert-file",
        type=Path,
        default=tls_d.cert_file,
        help="PEM client certificate (with its key unless --engine-tls-key-file) for engines "
        "that require one (default: none)",
    )
    tls.add_argument(
        "--engine-tls-key-file",
        type=Path,
        default=tls_d.key_file,
        help="PEM key of --engine-tls-cert-file, unencrypted (default: in the cert file)",
    )
    tls.add_argument(
        "--engine-tls-server-name",
        default=tls_d.server_name,
        help="name sent (SNI) and verified for every engine instead of its host name, for "
        "pod IPs that no certificate names (default: the engine's host name)",
    )
    tls.add_argument(
        "--engine-tls-insecure-skip-verify",
        action="store_true",
        default=tls_d.insecure_skip_verify,
        help="accept any engine certificate: encrypted, not authenticated; test clusters "
        "only (default: off, verified)",
    )


def _add_flow_arguments(parser: argparse.ArgumentParser) -> None:
    flow_d = FlowSettings()
    flow = parser.add_argument_group(
        "flow control", "Read only with --tenants-file: the router's queue and its limits."
    )
    flow.add_argument(
        "--max-queued",
        type=int,
        default=flow_d.max_queued,
        help="requests waiting in the router for an engine with room; one more gets 429, "
        f"0: none wait (default {flow_d.max_queued})",
    )
    flow.add_argument(
        "--queue-timeout",
        type=parse_duration,
        default=flow_d.queue_timeout,
        help=duration_help(
            "longest wait in the router's queue, then 503 with Retry-After", flow_d.queue_timeout
        ),
    )
    flow.add_argument(
        "--limits-store",
        metavar="redis://HOST:PORT[/DB]",
        default=flow_d.limits_store,
        help="the tenants' limit counters in this Redis, shared by every replica "
        "(default: in this process, exact for one replica)",
    )
    flow.add_argument(
        "--limits-store-timeout",
        type=parse_duration,
        default=flow_d.limits_store_timeout,
        help=duration_help(
            "longest wait for the limits store at admission, then the request is admitted "
            "(fail-open)",
            flow_d.limits_store_timeout,
        ),
    )


def _add_kv_arguments(parser: argparse.ArgumentParser) -> None:
    kv_d = KvEventsSettings()
    kv = parser.add_argument_group(
        "kv-aware routing", "Read only with --routing kv-aware: the engines' KV-event streams."
    )
    kv.add_argument(
        "--kv-events-port",
        type=parse_port,
        default=kv_d.port,
        help="port of each engine's KV-event publisher (vLLM's endpoint); the pod or Service "
        "annotation kv-events-port overrides it (default %(default)s)",
    )
    kv.add_argument(
        "--kv-events-replay-port",
        type=parse_port,
        default=kv_d.replay_port,
        help="port of each engine's replay socket (vLLM's replay_endpoint); annotation "
        "kv-events-replay-port (default %(default)s)",
    )
    kv.add_argument(
        "--kv-events-topic",
        default=kv_d.topic,
        help="topic prefix subscribed to, vLLM's `topic` (default: empty, every topic)",
    )
    kv.add_argument(
        "--kv-events-idle-timeout",
        type=parse_duration,
        default=kv_d.idle_timeout,
        help=duration_help(
            "an engine whose stream nothing confirmed for this long (no batch in sequence, no "
            "answer to the liveness check) has a stale index",
            kv_d.idle_timeout,
        ),
    )
    kv.add_argument(
        "--kv-events-check-interval",
        type=parse_duration,
        default=kv_d.check_interval,
        help=duration_help(
            "after this long without a batch, ask the engine's replay socket for its latest "
            "batch (the liveness check)",
            kv_d.check_interval,
        ),
    )
    kv.add_argument(
        "--kv-events-replay-timeout",
        type=parse_duration,
        default=kv_d.replay_timeout,
        help=duration_help(
            "a gap's replay must answer within this, else the index is cleared and rebuilt",
            kv_d.replay_timeout,
        ),
    )
    kv.add_argument(
        "--kv-events-max-frame",
        type=parse_size,
        default=kv_d.max_frame,
        help="larger frames from an engine's event sockets are dropped unread (a gap); bytes, "
        f"or 512KiB, 8MiB (default {format_size(kv_d.max_frame)})",
    )
    kv.add_argument(
        "--kv-events-budget",
        type=int,
        default=kv_d.budget,
        help="blocks a second one engine's events may cost (a frame counts 50 more, and one "
        "per 128 bytes); an engine over it is read more slowly (default %(default)s)",
    )
    kv.add_argument(
        "--kv-index-max-bytes",
        type=parse_size,
        default=kv_d.index_max_bytes,
        help="memory all engines' cache indexes may take together, shared equally "
        f"(default {format_size(kv_d.index_max_bytes)})",
    )
    kv.add_argument(
        "--kv-index-max-bytes-per-engine",
        type=parse_size,
        default=kv_d.index_max_bytes_per_engine,
        help="memory one engine's cache index may take at most "
        f"(default {format_size(kv_d.index_max_bytes_per_engine)})",
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
        help=duration_help(
            "an engine's /tokenize answering later is skipped, the request routed by load",
            kv_d.tokenize_timeout,
        ),
    )
    kv.add_argument(
        "--tokenizer-cache-size",
        type=parse_size,
        default=kv_d.tokenizer_cache_size,
        help="most bytes of encoded text --tokenizer keeps for repeated prompts "
        f"(default {format_size(kv_d.tokenizer_cache_size)})",
    )
    kv.add_argument(
        "--kv-placement",
        choices=("on", "off"),
        default="on" if kv_d.placement else "off",
        help="capacity-aware cache placement: hot prefixes kept on home engines, the tail "
        "sent to spill engines, re-planned every 2s; off: the greedy choice alone "
        "(default %(default)s)",
    )


class _Off(enum.Enum):
    """`--port off`, kept as itself until the settings (None there) so `--print-config`
    writes it back as `"off"`."""

    OFF = "off"


def _port_or_off(text: str) -> int | _Off:
    """`--port`: a port, or `off` (no OpenAI listener)."""
    return _Off.OFF if text.strip().lower() == "off" else parse_port(text)


def _pinned_names(text: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, address = item.partition("=")
        if not sep or not name or not address:
            raise argparse.ArgumentTypeError(f"{item!r}: expected NAME=ADDRESS")
        pairs.append((name, address))
    return tuple(pairs)


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
            inference_pool=ns.inference_pool,
            engine_port=ns.engine_port,
            engine_scheme=EngineScheme(ns.engine_scheme),
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
            port=None if ns.port is _Off.OFF else ns.port,
            grpc_health_port=ns.grpc_health_port,
            log_format=LogFormat(ns.log_format),
            log_level=ns.log_level.upper(),
            admin_port=ns.admin_port,
            ext_proc_port=ns.ext_proc_port,
            ext_proc_tls_cert=ns.ext_proc_tls_cert,
            ext_proc_tls_key=ns.ext_proc_tls_key,
            ext_proc_fallbacks=ns.ext_proc_fallbacks,
        ),
        proxy=ProxySettings(
            routing=RoutingName(ns.routing),
            connect_timeout=ns.connect_timeout,
            read_timeout=ns.read_timeout,
            max_failovers=ns.max_failovers,
            stream_resume_limit=ns.stream_resume_limit,
            max_body_size=ns.max_body_size,
            max_buffered_body_bytes=ns.max_buffered_body_bytes,
            max_connections=ns.max_connections,
            client_idle_timeout=ns.client_idle_timeout,
            client_header_timeout=ns.client_header_timeout,
            client_send_timeout=ns.client_send_timeout,
            first_byte_timeout=ns.first_byte_timeout,
            stalled_engine_timeout=ns.stalled_engine_timeout,
            access_log_sample=ns.access_log_sample,
            passthrough=not ns.no_passthrough,
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
            api_keys_file=ns.api_keys_file,
            engine_api_key_file=ns.engine_api_key_file,
            tenants_file=ns.tenants_file,
        ),
        flow=FlowSettings(
            max_queued=ns.max_queued,
            queue_timeout=ns.queue_timeout,
            limits_store=ns.limits_store,
            limits_store_timeout=ns.limits_store_timeout,
        ),
        outlier=OutlierSettings(
            consecutive_errors=ns.outlier_consecutive_errors,
            base_ejection=ns.outlier_base_ejection,
            max_ejection=ns.outlier_max_ejection,
            max_ejected_percent=ns.outlier_max_ejected_percent,
        ),
        dns=DnsSettings(timeout=ns.dns_timeout, pinned=dict(ns.resolve)),
        engine_tls=EngineTlsSettings(
            ca_file=ns.engine_tls_ca_file,
            cert_file=ns.engine_tls_cert_file,
            key_file=ns.engine_tls_key_file,
            server_name=ns.engine_tls_server_name,
            insecure_skip_verify=ns.engine_tls_insecure_skip_verify,
        ),
        kv_events=KvEventsSettings(
            port=ns.kv_events_port,
            replay_port=ns.kv_events_replay_port,
            topic=ns.kv_events_topic,
            idle_timeout=ns.kv_events_idle_timeout,
            check_interval=ns.kv_events_check_interval,
            replay_timeout=ns.kv_events_replay_timeout,
            max_frame=ns.kv_events_max_frame,
            budget=ns.kv_events_budget,
            tokenizer=ns.tokenizer,
            tokenize_timeout=ns.tokenize_timeout,
            tokenizer_cache_size=ns.tokenizer_cache_size,
            placement=ns.kv_placement == "on",
            index_max_bytes=ns.kv_index_max_bytes,
            index_max_bytes_per_engine=ns.kv_index_max_bytes_per_engine,
        ),
    )
