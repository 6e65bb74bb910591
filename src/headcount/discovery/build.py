"""Kubernetes discovery wired from settings: the one place `DiscoverySettings` becomes components.

`build_k8s_source` finds the cluster, opens one API client and builds the pod,
Service or InferencePool source `settings.mode` asks for. Every timeout and back-off bound
comes from the settings through `reflector_timing` and `lister_watcher`, so no
component keeps a default of its own; tests build theirs through them too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kubernetes_asyncio.client import ApiClient

from headcount import __version__
from headcount.config import ConfigError, DiscoveryMode, DiscoverySettings
from headcount.discovery.inference_pool import InferencePoolSource
from headcount.discovery.kube import KubeListerWatcher
from headcount.discovery.kubeconfig import load_kube_config
from headcount.discovery.listwatch import ListerWatcher
from headcount.discovery.pods import PodSource
from headcount.discovery.reflector import ReflectorTiming
from headcount.discovery.services import ServiceSource
from headcount.discovery.source import DiscoverySource, SourceStatus
from headcount.fleet import Fleet

__all__ = ["build_k8s_source", "k8s_source", "lister_watcher", "reflector_timing"]

_log = logging.getLogger(__name__)


def reflector_timing(settings: DiscoverySettings) -> ReflectorTiming:
    """The reflector's watch timeouts and back-off bounds from the settings."""
    return ReflectorTiming(
        watch_timeout_min=settings.watch_timeout_min,
        watch_timeout_max=settings.watch_timeout_max,
        backoff_initial=settings.backoff_initial,
        backoff_max=settings.backoff_max,
    )


def lister_watcher(
    api: ApiClient, resource: str, namespace: str, settings: DiscoverySettings
) -> KubeListerWatcher:
    """A `KubeListerWatcher` with the settings' API request, connect and watch-idle timeouts."""
    return KubeListerWatcher(
        api,
        resource,
        namespace,
        request_timeout=settings.request_timeout,
        connect_timeout=settings.connect_timeout,
        idle_timeout=settings.watch_idle_timeout,
    )


def k8s_source(
    settings: DiscoverySettings,
    fleet: Fleet,
    lister_watchers: Callable[[str], ListerWatcher],
    namespace: str,
) -> DiscoverySource:
    """The pod, Service or InferencePool source `settings.mode` asks for, over
    `lister_watchers(resource)` (which list in `namespace`)."""
    _require_kubernetes_mode(settings.mode)
    timing = reflector_timing(settings)
    if settings.mode is DiscoveryMode.K8S_PODS:
        return PodSource(
            fleet,
            lister_watchers("pods"),
            engine_port=settings.engine_port,
            namespace=namespace,
            label_selector=settings.label_selector,
            timing=timing,
            scheme=settings.engine_scheme,
        )
    if settings.mode is DiscoveryMode.INFERENCE_POOL:
        assert settings.inference_pool is not None, "checked by DiscoverySettings"
        return InferencePoolSource(
            fleet,
            lister_watchers("inferencepools"),
            lister_watchers("pods"),
            pool=settings.inference_pool,
            namespace=namespace,
            label_selector=settings.label_selector,
            timing=timing,
            scheme=settings.engine_scheme,
        )
    return ServiceSource(
        fleet,
        lister_watchers("services"),
        lister_watchers("endpointslices"),
        engine_port=settings.engine_port,
        namespace=namespace,
        label_selector=settings.label_selector,
        timing=timing,
        scheme=settings.engine_scheme,
    )


def _require_kubernetes_mode(mode: DiscoveryMode) -> None:
    if mode is DiscoveryMode.STATIC:
        raise ConfigError(f"--discovery {mode.value} is not a Kubernetes mode")


class _ClientOwningSource:
    """A source that closes the API client it was built with when its loop ends."""

    def __init__(self, source: DiscoverySource, api: ApiClient) -> None:
        self.status: SourceStatus = source.status
        self._source = source
        self._api = api

    async def run(self) -> None:
        try:
            await self._source.run()
        finally:
            await self._api.close()

    async def close(self) -> None:
        """Release the API client of a source whose `run()` never started."""
        await self._api.close()


async def build_k8s_source(settings: DiscoverySettings, fleet: Fleet) -> DiscoverySource:
    """The Kubernetes source `settings.mode` asks for; raises `ConfigError`.

    The API client lives as long as the returned source's `run()`.
    """
    _require_kubernetes_mode(settings.mode)
    kube = await load_kube_config(settings.kubeconfig)
    namespace = settings.namespace or kube.namespace
    api = ApiClient(kube.configuration)
    api.user_agent = f"headcount/{__version__}"
    source = k8s_source(
        settings,
        fleet,
        lambda resource: lister_watcher(api, resource, namespace, settings),
        namespace,
    )
    _log.info(
        "discovery: %s%s in namespace %s (label selector %r) via %s at %s",
        settings.mode.value,
        f" {settings.inference_pool}" if settings.inference_pool else "",
        namespace,
        settings.label_selector,
        kube.origin,
        kube.configuration.host,
    )
    return _ClientOwningSource(source, api)
