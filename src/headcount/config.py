"""One typed, frozen settings tree for `headcount serve`: every default and every check.

Each concern has its own dataclass; every field has a default and the reason
for it, and nothing else in the router keeps a default of its own. Each
dataclass validates itself when built (`Settings` checks what spans several),
raising `ConfigError` with a message a person can act on that names the flag
(the CLI prints it; no traceback), so settings built in code are held to the
same rules as the command line. The flags that fill it are in `cli/serve_flags.py`.
Over 450 lines on purpose: every default beside its reason, and every check,
read in one place. The names of the routing policies live here too
(`RoutingName`), below the `routing/` package that implements them.
"""

from __future__ import annotations

import enum
import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from headcount.selectors import SelectorError, parse_label_selector, valid_dns_subdomain

__all__ = [
    "BUILTIN_TOKENIZER",
    "CLIENT_SHARE_OF_FILES",
    "LOG_LEVELS",
    "AuthSettings",
    "ConfigError",
    "DiscoveryMode",
    "DiscoverySettings",
    "DnsSettings",
    "EngineScheme",
    "EngineTlsSettings",
    "FlowSettings",
    "HealthSettings",
    "KvEventsSettings",
    "LogFormat",
    "OutlierSettings",
    "ProbeSettings",
    "ProxySettings",
    "RoutingName",
    "ServerSettings",
    "Settings",
    "SupervisionSettings",
    "backend_base_url",
    "redis_address",
]


class RoutingName(enum.StrEnum):
    """The routing policies `--routing` names (`routing/` implements each)."""

    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    SESSION = "session"
    PREFIX = "prefix"
    KV_AWARE = "kv-aware"


class ConfigError(ValueError):
    """A setting is invalid; the message says which and why."""


class DiscoveryMode(enum.StrEnum):
    STATIC = "static"
    K8S_PODS = "k8s-pods"
    K8S_SERVICES = "k8s-services"
    INFERENCE_POOL = "inference-pool"


class EngineScheme(enum.StrEnum):
    """How Kubernetes engines are spoken to (`--engine-scheme`); a static URL says its own."""

    HTTP = "http"
    HTTPS = "https"


_SCHEMES = frozenset(scheme.value for scheme in EngineScheme)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""The levels `--log-level` takes, least severe first."""


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


@dataclass(frozen=True)
class ServerSettings:
    host: str = "0.0.0.0"
    """All interfaces: in a pod the kubelet probes and the Service reach the pod IP."""
    port: int | None = 8080
    """None (`--port off`): no OpenAI listener of the router's own, an endpoint picker only
    (`ext_proc_port`), its health and metrics on `admin_port`."""
    grpc_health_port: int | None = None
    """Off by default; the standard grpc.health.v1 service for gRPC-probing platforms."""
    log_format: LogFormat = LogFormat.TEXT
    log_level: str = "INFO"
    admin_port: int | None = None
    """Off by default (everything on `port`, as before); set, `/engines`, `/metrics` and the
    health endpoints move to this port, which the Service need not expose, and `port`
    answers only the OpenAI API."""
    ext_proc_port: int | None = None
    """Off by default; set, the router is also a gateway's endpoint picker: Envoy's
    `ExternalProcessor` gRPC service (with `grpc.health.v1`) on this port."""
    ext_proc_tls_cert: Path | None = None
    """PEM certificate chain for TLS on `ext_proc_port` (gateways speak TLS by default);
    None: h2c."""
    ext_proc_tls_key: Path | None = None
    ext_proc_fallbacks: int = 0
    """Endpoints named after the one picked, for the gateway to retry on. 0: the picked one
    alone, as Envoy's ORIGINAL_DST cluster reads `x-gateway-destination-endpoint` as one
    address."""

    def __post_init__(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"--log-level {self.log_level}: use one of {', '.join(LOG_LEVELS)}")
        if self.admin_port and self.admin_port in (self.port, self.grpc_health_port):
            raise ConfigError(
                f"--admin-port {self.admin_port} must differ from --port and --grpc-health-port"
            )
        if self.ext_proc_port and self.ext_proc_port in (
            self.port,
            self.grpc_health_port,
            self.admin_port,
        ):
            raise ConfigError(
                f"--ext-proc-port {self.ext_proc_port} must differ from --port, "
                "--grpc-health-port and --admin-port"
            )
        if self.port is None and self.ext_proc_port is None:
            raise ConfigError("--port off needs --ext-proc-port: the router would serve nothing")
        if self.port is None and self.admin_port is None:
            raise ConfigError(
                "--port off needs --admin-port: /health and /metrics have no other port"
            )
        if not 0 <= self.ext_proc_fallbacks <= 8:
            raise ConfigError(f"--ext-proc-fallbacks {self.ext_proc_fallbacks}: use 0-8")
        self._check_ext_proc_tls()

    def _check_ext_proc_tls(self) -> None:
        cert, key = self.ext_proc_tls_cert, self.ext_proc_tls_key
        if (cert is None) != (key is None):
            raise ConfigError("--ext-proc-tls-cert and --ext-proc-tls-key go together")
        if cert is not None and self.ext_proc_port is None:
            raise ConfigError("--ext-proc-tls-cert needs --ext-proc-port")
        for flag, path in (("--ext-proc-tls-cert", cert), ("--ext-proc-tls-key", key)):
            if path is not None and not path.is_file():
                raise ConfigError(f"{flag} {path}: no such file")


@dataclass(frozen=True)
class ProxySettings:
    routing: RoutingName = RoutingName.ROUND_ROBIN
    connect_timeout: float = 2.0
    """Short: an engine that does not accept within 2 s is failed over, not waited on."""
    read_timeout: float = 300.0
    """Longest silence allowed between two bytes of an upstream response (long prefills)."""
    max_failovers: int = 2
    """Extra engines tried when one fails before its first response byte."""
    stream_resume_limit: int = 2
    """Times one broken stream is continued on another engine (`proxy/resume.py`): a rolling
    update can move a long answer twice; a request that breaks every engine it reaches (a
    poison prompt) stops after three. 0 turns resume off."""
    max_body_size: int = 32 * 1024 * 1024
    """Requests carry prompts and base64 images; 32 MiB bounds memory per request."""
    max_header_size: int = 64 * 1024
    """Request line plus header fields of one client request (more gets 431), and status line
    plus header fields of one engine response (more is a protocol violation: 502)."""
    client_idle_timeout: float = 75.0
    """Idle client connections close after this; above the 60 s idle timeout of common load
    balancers, so that they, not we, close first (no race on a reused connection)."""
    max_pipeline: int = 16
    """Pipelined requests parsed ahead of the one being answered before reading pauses."""
    pool_idle_timeout: float = 4.0
    """Idle upstream connections close after this: under uvicorn's 5 s keep-alive (vLLM's
    server), so we close first and never send on a connection the engine is closing."""
    pool_max_idle: int = 256
    """Idle upstream connections kept per engine."""
    affinity_epsilon: float = 0.25
    """Session and prefix routing: an engine keeps its keys until its in-flight count exceeds
    (1 + epsilon) times the mean (consistent hashing with bounded load)."""
    client_header_timeout: float = 30.0
    """A request head must arrive whole within this of its first read, else 408 (slowloris);
    a real client writes its head at once."""
    client_send_timeout: float = 30.0
    """A client that takes nothing of a pending response for this long is disconnected and
    its exchange released: a reader that stalled must not hold an engine slot."""
    max_connections: int | None = None
    """Client connections open at once; one more gets a 503 and is closed. None: 90% of the
    open-file limit (raised to its hard limit at start), the rest left for engine
    connections, probes and logs, so idle clients cannot starve them."""
    max_buffered_body_bytes: int = 512 * 1024 * 1024
    """Request-body bytes held across all clients, from arrival to the end of the exchange
    (16 bodies of the largest size); past it a request gets 503 `overloaded`, not memory."""
    inline_parse_max: int = 64 * 1024
    """Bodies up to this are parsed on the event loop (at most ~4 ms even for hostile JSON);
    larger ones in a worker process, so that no body stalls other clients."""
    parse_workers: int = 2
    """Worker processes for large bodies, started on first use; a hostile body ties one up
    for seconds, never the event loop. Bodies over 1 MiB take all but one (with 1, a second
    is started for the smaller bodies beside a large one)."""
    parse_worker_memory: int = 1024 * 1024 * 1024
    """Address space one large-body parse may add: real bodies need a few times their size
    (token-id arrays ~7x), hostile nesting ~30x; past it the request gets 413."""
    first_byte_timeout: float | None = None
    """Off by default: a long prompt's prefill legitimately takes minutes before the first
    byte. Set, an attempt with no response byte within it is failed over to another engine."""
    stalled_engine_timeout: float = 30.0
    """A request that waited this long for its first byte from an engine that sent none to
    any request meanwhile fails over, and the engine is ejected (`proxy/stalls.py`): it
    stopped answering while its probes pass. Above a long prompt's prefill on an idle engine
    (an engine busy with one still answers the others); 0 is off."""
    access_log_sample: float = 0.01
    """Share of successful requests given an access-log line (`headcount.access`); errors,
    cut streams and failovers always get one. 0: no access log, 1: every request."""
    passthrough: bool = True
    """A `POST /v1/...` the router does not know by name is routed by its body's `model` like
    the others (vLLM grows endpoints faster than routers learn them); off
    (`--no-passthrough`), such paths get 404."""

    def __post_init__(self) -> None:
        if self.max_failovers < 0:
            raise ConfigError("--max-failovers must be 0 or more")
        if self.stream_resume_limit < 0:
            raise ConfigError("--stream-resume-limit must be 0 (off) or more")
        _require_positive(
            ("--connect-timeout", self.connect_timeout),
            ("--read-timeout", self.read_timeout),
            ("--client-idle-timeout", self.client_idle_timeout),
            ("--client-header-timeout", self.client_header_timeout),
            ("--client-send-timeout", self.client_send_timeout),
        )
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError("--max-connections must be at least 1")
        if self.max_buffered_body_bytes < self.max_body_size:
            raise ConfigError(
                "--max-buffered-body-bytes must be at least --max-body-size "
                f"({self.max_body_size}): else a request of the largest size is never accepted"
            )
        if self.parse_workers < 1:
            raise ConfigError("parse_workers must be at least 1")
        if self.first_byte_timeout is not None:
            _require_positive(("--first-byte-timeout", self.first_byte_timeout))
        if not 0 <= self.stalled_engine_timeout < math.inf:
            raise ConfigError("--stalled-engine-timeout must be 0 (off) or a positive duration")
        if not 0 <= self.access_log_sample <= 1:
            raise ConfigError("--access-log-sample must be within 0-1 (0: off, 1: every request)")

    def connection_limit(self, open_files: int) -> int:
        """`max_connections`, or its default for a process that may open `open_files` files."""
        if self.max_connections is not None:
            return self.max_connections
        return max(1, int(open_files * CLIENT_SHARE_OF_FILES))


CLIENT_SHARE_OF_FILES = 0.9
"""The default `--max-connections`, as a share of the open-file limit (see the field)."""


@dataclass(frozen=True)
class ProbeSettings:
    interval: float = 5.0
    """How often every engine's /v1/models and /metrics are read."""
    timeout: float = 2.0
    """Per probe request; a hung engine costs one timeout, never a stuck loop."""
    concurrency: int = 64
    """Probes in flight at once, so N unreachable engines cost about one timeout."""
    unhealthy_after: int = 2
    """Consecutive failed probes before a ready engine leaves rotation."""
    max_bytes: int = 8 * 1024 * 1024
    """Largest /v1/models or /metrics answer read (reading stops there: a failed probe, or load
    unknown): vLLM's are kilobytes to a few MiB, and a broken engine must not cost more."""
    max_models: int = 10_000
    """Model cards kept per engine; the rest of its /v1/models is ignored (one warning), so an
    engine listing 200,000 adapters costs a bounded parse and bounded memory."""

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.unhealthy_after < 1:
            raise ConfigError("--probe-concurrency and --unhealthy-after must be at least 1")
        _require_positive(("--probe-interval", self.interval), ("--probe-timeout", self.timeout))
        if self.max_bytes < 1024:
            raise ConfigError("--probe-max-bytes must be at least 1KiB")
        if self.max_models < 1:
            raise ConfigError("--probe-max-models must be at least 1")


@dataclass(frozen=True)
class SupervisionSettings:
    """How a long-lived task that crashed (the prober) is restarted."""

    restart_delay: float = 1.0
    """First wait before a restart: long enough not to spin on a failure that repeats at once."""
    restart_delay_max: float = 30.0
    """The wait doubles on each crash in a row, up to this."""
    healthy_after: float = 60.0
    """A task that ran this long before crashing starts again from `restart_delay`."""

    def __post_init__(self) -> None:
        _require_positive(
            ("restart_delay", self.restart_delay),
            ("restart_delay_max", self.restart_delay_max),
            ("healthy_after", self.healthy_after),
        )


@dataclass(frozen=True)
class DiscoverySettings:
    mode: DiscoveryMode = DiscoveryMode.STATIC
    backends: tuple[str, ...] = ()
    """Engine URLs for static mode, kept as `backend_base_url` (no trailing slash, no /v1)."""
    kubeconfig: Path | None = None
    """None: in-cluster config, then $KUBECONFIG, then ~/.kube/config."""
    namespace: str | None = None
    """None: the pod's own namespace in-cluster, else the kubeconfig context's."""
    label_selector: str = ""
    inference_pool: str | None = None
    """`inference-pool` mode: the `InferencePool` (inference.networking.k8s.io/v1) whose
    selector and target ports say which pods are engines, on which ports."""
    engine_port: int = 8000
    engine_scheme: EngineScheme = EngineScheme.HTTP
    """Kubernetes modes: plain HTTP unless the engines terminate TLS themselves (a mesh, a
    managed cluster); a Service port named or with appProtocol `https` is https anyway."""
    watch_idle_timeout: float = 90.0
    """The API server sends a bookmark about once a minute; 90 s of silence means a dead stream."""
    watch_timeout_min: float = 300.0
    watch_timeout_max: float = 600.0
    """Server-side watch timeout drawn in [min, max] (client-go: 5-10 min) so replicas do not
    relist in lockstep."""
    request_timeout: float = 30.0
    """Client-side bound on one LIST (connect plus whole response)."""
    connect_timeout: float = 5.0
    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    """Reconnect back-off bounds, as client-go's reflector."""

    def __post_init__(self) -> None:
        if self.mode is DiscoveryMode.STATIC:
            for url in self.backends:
                _check_backend_url(url)
            object.__setattr__(self, "backends", tuple(map(backend_base_url, self.backends)))
        elif self.backends:
            raise ConfigError(
                f"--backends only applies to --discovery static, not {self.mode.value}"
            )
        _check_inference_pool(self.mode, self.inference_pool)
        if self.kubeconfig is not None and not self.kubeconfig.is_file():
            raise ConfigError(f"--kubeconfig {self.kubeconfig}: no such file")
        if self.watch_timeout_min > self.watch_timeout_max:
            raise ConfigError("--watch-timeout-min must not exceed --watch-timeout-max")
        try:
            parse_label_selector(self.label_selector)
        except SelectorError as exc:
            raise ConfigError(f"--label-selector {self.label_selector!r}: {exc}") from None
        _require_positive(("--watch-idle-timeout", self.watch_idle_timeout))


def _check_inference_pool(mode: DiscoveryMode, pool: str | None) -> None:
    """`--inference-pool` is required by `inference-pool` mode, refused by the others."""
    if mode is not DiscoveryMode.INFERENCE_POOL:
        if pool is not None:
            raise ConfigError(
                f"--inference-pool only applies to --discovery inference-pool, not {mode.value}"
            )
        return
    if pool is None:
        raise ConfigError("--discovery inference-pool needs --inference-pool NAME")
    if not valid_dns_subdomain(pool):
        raise ConfigError(f"--inference-pool {pool!r}: not a Kubernetes object name")


@dataclass(frozen=True)
class OutlierSettings:
    """Passive outlier detection (`headcount.fleet.outliers`): engines that fail requests while
    their probes pass leave rotation for a while."""

    consecutive_errors: int = 5
    """Errors in a row that eject an engine (Envoy's default); 0 is off. What counts as one is
    `fleet.outliers`' rule: a 5xx caused by the request never does."""
    base_ejection: float = 30.0
    """An ejection lasts this times the engine's ejection count (Envoy's default)."""
    max_ejection: float = 300.0
    """The longest ejection: an engine that was broken for an hour is retried every 5 min."""
    max_ejected_percent: float = 50.0
    """Panic threshold: with more than this share of a model's engines ejected, the model is
    routed to all of them, as if none were: a partial failure must not become a total one."""

    def __post_init__(self) -> None:
        if self.consecutive_errors < 0:
            raise ConfigError("--outlier-consecutive-errors must be 0 (off) or more")
        _require_positive(("--outlier-base-ejection", self.base_ejection))
        if self.max_ejection < self.base_ejection:
            raise ConfigError("--outlier-max-ejection must not be under --outlier-base-ejection")
        if not 0 <= self.max_ejected_percent <= 100:
            raise ConfigError("--outlier-max-ejected-percent must be within 0-100")


@dataclass(frozen=True)
class DnsSettings:
    """How engine host names are looked up, by the proxy and the probes alike (never cached:
    `headcount._http.resolve`)."""

    timeout: float = 0.5
    """Cluster DNS answers in milliseconds; a lookup slower than this is a DNS failure (fail
    over, never eject), not an engine's silence. It must stay under --probe-timeout so that a
    probe stuck on DNS is reported as such, hence well under a second."""
    pinned: Mapping[str, str] = field(default_factory=dict)
    """Host names answered with a fixed address (`--resolve NAME=ADDRESS`), never looked up:
    Service names of a cluster tried locally (sim-apiserver), whose DNS this machine lacks."""

    def __post_init__(self) -> None:
        _require_positive(("--dns-timeout", self.timeout))
        for name, address in self.pinned.items():
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise ConfigError(
                    f"--resolve {name}={address}: {address!r} is not an IP address"
                ) from None


@dataclass(frozen=True)
class EngineTlsSettings:
    """How the router trusts and proves itself to engines spoken to over https.

    Read only for https engines; the context is built once at start
    (`headcount._http.tls`), so a bad file stops the router there, not at its first request.
    """

    ca_file: Path | None = None
    """PEM bundle of the CAs engine certificates are checked against; None: the system's."""
    cert_file: Path | None = None
    """PEM client certificate (and its key, unless `key_file`), for engines that require one."""
    key_file: Path | None = None
    server_name: str | None = None
    """The name sent as SNI and checked against every engine certificate, in place of the
    engine's host name: a pod IP rarely appears in a certificate, a shared name does."""
    insecure_skip_verify: bool = False
    """Off: certificates are verified. On: any certificate is accepted (encrypted, not
    authenticated), for a test cluster's self-signed engines only."""

    def __post_init__(self) -> None:
        for flag, path in (
            ("--engine-tls-ca-file", self.ca_file),
            ("--engine-tls-cert-file", self.cert_file),
            ("--engine-tls-key-file", self.key_file),
        ):
            if path is not None and not path.is_file():
                raise ConfigError(f"{flag} {path}: no such file")
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError("--engine-tls-key-file needs --engine-tls-cert-file")
        if self.server_name is not None and not self.server_name.strip():
            raise ConfigError("--engine-tls-server-name must not be empty")
        if self.insecure_skip_verify and self.ca_file is not None:
            raise ConfigError(
                "--engine-tls-insecure-skip-verify checks no certificate: drop it or "
                "--engine-tls-ca-file"
            )


@dataclass(frozen=True)
class HealthSettings:
    discovery_stale_after: float = 120.0
    """Older discovery makes /health degraded (and /readyz fail with ready_requires_fresh)."""
    discovery_dead_after: float = 300.0
    """No list/watch attempt finished this long: the loop is wedged, /livez fails."""
    ready_requires_engines: bool = False
    """Off: a fleet scaled to zero keeps a ready router that answers a clear 503."""
    ready_requires_fresh: bool = False
    drain_delay: float = 5.0
    """After SIGTERM, keep serving new requests while endpoint removal propagates."""
    drain_timeout: float = 30.0
    """Then wait this long at most for in-flight streams to finish."""


@dataclass(frozen=True)
class AuthSettings:
    api_keys_file: Path | None = None
    """Off by default: anyone who reaches the port may use it. Set, the OpenAI API (and
    `/engines`, `/metrics` unless on `--admin-port`) needs `Authorization: Bearer <key>`
    with a key from this file (one a line, clear or `sha256:<hex>`)."""
    engine_api_key_file: Path | None = None
    """Off by default; for engines started with vLLM's `--api-key`: sent to engines as
    `Authorization: Bearer` on every probe and forwarded request, replacing the client's."""
    tenants_file: Path | None = None
    """Off by default. Set, a TOML file of tenants (keys, priority, weight, limits): its keys
    authenticate like `--api-keys-file`'s, and flow control is on (`FlowSettings`)."""
    key_file_check_interval: float = 5.0
    """How often the key files' identity (inode, size, mtime) is checked; SIGHUP reloads
    at once. A stat every few seconds costs nothing and rotation needs no signal."""

    def __post_init__(self) -> None:
        for flag, path in (
            ("--api-keys-file", self.api_keys_file),
            ("--engine-api-key-file", self.engine_api_key_file),
            ("--tenants-file", self.tenants_file),
        ):
            if path is not None and not path.is_file():
                raise ConfigError(f"{flag} {path}: no such file")
        _require_positive(("key_file_check_interval", self.key_file_check_interval))


@dataclass(frozen=True)
class FlowSettings:
    """Flow control, on with `--tenants-file`: the router's queue and the limits' store."""

    max_queued: int = 1000
    """Requests waiting in the router for an engine with room; one more is refused (429)."""
    queue_timeout: float = 30.0
    """Longest wait in the router's queue before a 503 with `Retry-After`; under the 60 s
    idle timeout of common load balancers, which would cut a longer wait silently."""
    limits_store: str | None = None
    """None: the counters live in this process (exact for one replica). `redis://HOST:PORT`
    (optionally `/DB`): one set of counters shared by every replica."""
    limits_store_timeout: float = 0.1
    """Longest wait for Redis at admission; past it the request is admitted (fail-open)."""

    def __post_init__(self) -> None:
        if self.max_queued < 0:
            raise ConfigError("--max-queued must be 0 (no queue: refuse at once) or more")
        _require_positive(
            ("--queue-timeout", self.queue_timeout),
            ("--limits-store-timeout", self.limits_store_timeout),
        )
        if self.limits_store is not None:
            redis_address(self.limits_store)


def redis_address(url: str) -> tuple[str, int, int]:
    """`redis://HOST[:PORT][/DB]` as (host, port, db); `ConfigError` names what is wrong."""
    parts = urlsplit(url)
    problem = None
    if parts.scheme != "redis":
        problem = "expected redis://HOST:PORT"
    elif not parts.hostname:
        problem = "no host"
    elif parts.username or parts.password:
        problem = "no password in the URL (Redis AUTH is not supported)"
    db = parts.path.strip("/") or "0"
    if problem is None and not db.isdigit():
        problem = f"the database must be a number, not {db!r}"
    try:
        port = parts.port or 6379
    except ValueError:
        port, problem = 0, "the port must be a number within 1-65535"
    if problem is not None:
        raise ConfigError(f"--limits-store {url}: {problem}")
    return parts.hostname or "", port, int(db)


BUILTIN_TOKENIZER = "builtin"
"""`--tokenizer builtin`: the simulated engines' own tokenizer, not a directory."""


@dataclass(frozen=True)
class KvEventsSettings:
    """The engines' KV-event streams, which `--routing kv-aware` routes on."""

    port: int = 5557
    """vLLM's default `endpoint` port of `--kv-events-config`; a pod annotation overrides it."""
    replay_port: int = 5558
    """vLLM's default `replay_endpoint` port."""
    topic: str = ""
    """Subscribed topic prefix; vLLM's default topic is empty."""
    idle_timeout: float = 10.0
    """An engine's stream that nothing confirmed complete for this long (no batch in sequence,
    no answer to the liveness check) is stale."""
    check_interval: float = 3.0
    """After this long without a batch, the liveness check asks the engine's replay socket
    whether a batch came after the last one applied (and at once on connecting)."""
    replay_timeout: float = 2.0
    """A gap's replay must answer within this, else the index is cleared and rebuilt."""
    max_frame: int = 2 * 1024 * 1024
    """The largest frame read from an engine's event sockets; ZMQ drops the connection on a
    larger one before reading it (the batch is missed: a gap). One scheduler step that
    prefills 128k tokens in 16-token blocks and evicts as many is about 1.1 MiB (vLLM's map
    layout; 0.75 MiB in 0.10's), a default 8k-token step 0.07 MiB; decoding a frame of this
    size holds the loop for tens of milliseconds at worst (one object per byte)."""
    budget: int = 50_000
    """Work one engine's events may cost per second, in blocks stored or removed; a frame
    also costs 50, plus one per 128 bytes (a block costs a few microseconds). An engine
    prefilling 100k tokens a second (more than one GPU does) in 16-token blocks, evicting as
    many, spends about half of it; one that sends more is read more slowly, its excess
    dropped by its own publisher (a gap), and costs the router about a tenth of a core."""
    tokenizer: str | None = None
    """A directory in Hugging Face layout, or "builtin" (the simulator's); None: the engines'
    own `POST /tokenize`."""
    tokenize_timeout: float = 1.0
    """An engine's `/tokenize` that answers later is skipped: the request is routed by load."""
    tokenizer_cache_size: int = 32 * 1024 * 1024
    """Bytes of encoded text the router's tokenizer keeps (its segment cache, least recently
    used out): about 4 million tokens of English with their text (~8 bytes a token), a few
    thousand tenants' system prompts and their recent turns, within the router's own size.
    Tokenizing anew costs about 1 ms per 1,000 tokens."""
    placement: bool = False
    """Capacity-aware cache placement (`routing/kv/placement.py`): hot prefixes get home
    engines, the tail spill engines. Off by default: it did not beat the greedy choice on
    the routing benchmark (bench/RESULTS.md)."""
    index_max_bytes: int = 1 << 30
    """All engines' cache indexes together: about 5.6 million blocks (192 bytes each at most),
    enough for 200 engines of 28,000 blocks (an 80 GB H100 serving an 8B model). Each engine
    gets an equal share, at most `index_max_bytes_per_engine`."""
    index_max_bytes_per_engine: int = 64 << 20
    """One engine's cache index: 349,525 blocks, 12 times an H100's with an 8B model. It
    also bounds the longest step on the event loop: an index's dictionaries grow by copying
    their table at once, and at this size the largest copy (174,763 entries) takes 15 to
    20 ms where 700,000 took 80 on a busy 2-core machine; a 141 GB H200 serving a 0.5B
    model (700,000 blocks) needs 128MiB and pays that."""

    def __post_init__(self) -> None:
        for flag, port in (
            ("--kv-events-port", self.port),
            ("--kv-events-replay-port", self.replay_port),
        ):
            if not 1 <= port <= 65535:
                raise ConfigError(f"{flag} {port}: use 1-65535")
        for flag, size in (
            ("--kv-index-max-bytes", self.index_max_bytes),
            ("--kv-index-max-bytes-per-engine", self.index_max_bytes_per_engine),
        ):
            if size < 1 << 20:
                raise ConfigError(f"{flag} {size}: use at least 1MiB")
        _require_positive(
            ("--kv-events-idle-timeout", self.idle_timeout),
            ("--kv-events-check-interval", self.check_interval),
            ("--kv-events-replay-timeout", self.replay_timeout),
            ("--kv-events-budget", self.budget),
            ("--tokenize-timeout", self.tokenize_timeout),
            ("--tokenizer-cache-size", self.tokenizer_cache_size),
        )
        if self.check_interval + self.replay_timeout >= self.idle_timeout:
            raise ConfigError(
                f"--kv-events-check-interval {self.check_interval:g}s plus "
                f"--kv-events-replay-timeout {self.replay_timeout:g}s must be under "
                f"--kv-events-idle-timeout {self.idle_timeout:g}s: a quiet stream would turn "
                "stale between two liveness checks"
            )
        if self.max_frame < 1024:
            raise ConfigError(f"--kv-events-max-frame {self.max_frame}: use at least 1KiB")
        tokenizer = self.tokenizer
        if tokenizer not in (None, BUILTIN_TOKENIZER) and not _has_tokenizer_json(tokenizer):
            raise ConfigError(
                f"--tokenizer {tokenizer}: no tokenizer.json there "
                f'(a Hugging Face tokenizer directory, or "{BUILTIN_TOKENIZER}")'
            )


@dataclass(frozen=True)
class Settings:
    """The whole router: built from the flags, or in code with the same checks."""

    server: ServerSettings = field(default_factory=ServerSettings)
    proxy: ProxySettings = field(default_factory=ProxySettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    outlier: OutlierSettings = field(default_factory=OutlierSettings)
    dns: DnsSettings = field(default_factory=DnsSettings)
    supervision: SupervisionSettings = field(default_factory=SupervisionSettings)
    kv_events: KvEventsSettings = field(default_factory=KvEventsSettings)
    flow: FlowSettings = field(default_factory=FlowSettings)
    engine_tls: EngineTlsSettings = field(default_factory=EngineTlsSettings)

    def __post_init__(self) -> None:
        """The checks that span parts: a lookup ends before the probe that waits on it, a
        static router needs engines, and in Kubernetes modes liveness must outlast the slowest
        discovery round."""
        if self.dns.timeout >= self.probe.timeout:
            raise ConfigError(
                f"--dns-timeout {self.dns.timeout:g}s must be under --probe-timeout "
                f"{self.probe.timeout:g}s: a probe stuck on DNS would blame the engine"
            )
        discovery, dead_after = self.discovery, self.health.discovery_dead_after
        if discovery.mode is DiscoveryMode.STATIC:
            if not discovery.backends:
                raise ConfigError("--discovery static needs --backends URL[,URL...]")
            return
        slowest_round = discovery.backoff_max + max(
            discovery.watch_idle_timeout, discovery.request_timeout
        )
        if dead_after <= slowest_round:
            raise ConfigError(
                f"--discovery-dead-after {dead_after:g}s must exceed --backoff-max "
                "plus the longer of --watch-idle-timeout and --api-request-timeout "
                f"({slowest_round:g}s): an unreachable API server alone must never fail /livez"
            )


def _require_positive(*values: tuple[str, float]) -> None:
    for flag, value in values:
        if value <= 0:
            raise ConfigError(f"{flag} must be positive")


def _has_tokenizer_json(directory: str) -> bool:
    return (Path(directory) / "tokenizer.json").is_file()


def backend_base_url(url: str) -> str:
    """An engine URL without a trailing slash or a final `/v1`: the router adds `/v1/...`
    itself, and an OpenAI `base_url` (`http://host:8000/v1`) means the engine at its root."""
    trimmed = url.rstrip("/")
    if urlsplit(trimmed).path.endswith("/v1"):
        return trimmed.removesuffix("/v1").rstrip("/")
    return trimmed


def _check_backend_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise ConfigError(f"--backends {url!r}: expected http://host:port or https://host:port")
    try:
        _ = parts.port
    except ValueError as exc:
        raise ConfigError(f"--backends {url!r}: {exc}") from None
