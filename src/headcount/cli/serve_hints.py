"""Start-up hints for `headcount serve`: what a command line accepted probably did not mean.

An engine URL written as an OpenAI `base_url`, a flag the chosen mode never
reads (flow control's without `--tenants-file`, engine TLS's without an https
engine), a watch idle timeout under the API server's bookmark interval: each
is accepted (the router starts) and named once at start with what to do
instead, rather than found later as an unhealthy engine or a relist every few
seconds.
Pure: the settings and the flags given in, the warnings out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from headcount.config import DiscoveryMode, RoutingName, Settings, backend_base_url

__all__ = ["BOOKMARK_INTERVAL", "serve_hints"]

BOOKMARK_INTERVAL = 60.0
"""About how often a Kubernetes API server sends a watch bookmark, in seconds."""

_KUBERNETES_ONLY = (
    "--kubeconfig",
    "--namespace",
    "--label-selector",
    "--engine-port",
    "--engine-scheme",
    "--watch-idle-timeout",
    "--watch-timeout-min",
    "--watch-timeout-max",
    "--api-request-timeout",
    "--api-connect-timeout",
    "--backoff-initial",
    "--backoff-max",
)
_KV_AWARE_ONLY = (
    "--kv-events-port",
    "--kv-events-replay-port",
    "--kv-events-topic",
    "--kv-events-idle-timeout",
    "--kv-events-replay-timeout",
    "--tokenizer",
    "--tokenize-timeout",
)
_FLOW_ONLY = ("--max-queued", "--queue-timeout", "--limits-store", "--limits-store-timeout")
_ENGINE_TLS_ONLY = (
    "--engine-tls-ca-file",
    "--engine-tls-cert-file",
    "--engine-tls-key-file",
    "--engine-tls-server-name",
    "--engine-tls-insecure-skip-verify",
)


def serve_hints(settings: Settings, given: Collection[str], backends: Sequence[str]) -> list[str]:
    """Warnings about `settings`, built from the flags in `given` and `backends` as typed."""
    hints = [
        f"--backends {url}: headcount adds /v1/... itself; using {backend_base_url(url)} "
        "(write the engine as http://host:port)"
        for url in backends
        if backend_base_url(url) != url.rstrip("/")
    ]
    discovery = settings.discovery
    if discovery.mode is DiscoveryMode.STATIC:
        hints += _unused(given, _KUBERNETES_ONLY, "--discovery static")
        if not any(url.startswith("https://") for url in discovery.backends):
            hints += _unused(given, _ENGINE_TLS_ONLY, "no https:// engine in --backends")
    else:
        if discovery.mode is DiscoveryMode.INFERENCE_POOL:
            pool = "--discovery inference-pool (the pool's targetPorts are the ports)"
            hints += _unused(given, ("--engine-port",), pool)
        hints += _bookmark_hints(discovery.watch_idle_timeout)
    if settings.proxy.routing is not RoutingName.KV_AWARE:
        hints += _unused(given, _KV_AWARE_ONLY, f"--routing {settings.proxy.routing.value}")
    if settings.auth.tenants_file is None:
        hints += _unused(given, _FLOW_ONLY, "flow control off (no --tenants-file)")
    return hints


def _bookmark_hints(idle: float) -> list[str]:
    if idle >= BOOKMARK_INTERVAL:
        return []
    return [
        f"--watch-idle-timeout {idle:g}s is under the API server's bookmark interval "
        f"(about {BOOKMARK_INTERVAL:g}s): a quiet watch would time out and relist every "
        f"{idle:g}s; use {BOOKMARK_INTERVAL * 1.5:g}s or more"
    ]


def _unused(given: Collection[str], flags: Sequence[str], mode: str) -> list[str]:
    ignored = [flag for flag in flags if flag in given]
    if not ignored:
        return []
    return [f"{', '.join(ignored)}: not used with {mode}; ignored"]
