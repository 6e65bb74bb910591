"""A simulated Kubernetes cluster: the API server emulator and engine pods on loopback IPs.

The emulator runs on the caller's event loop; each engine pod gets its own
loopback address (127.0.0.0/8 all routes to `lo`) and every engine listens on
one shared port, as pods do. `router_flags` describes a router that discovers
the pods (`--discovery k8s-pods` on the cluster's kubeconfig), `pool_router_flags`
one that discovers them through an `InferencePool` (`apply_inference_pool`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headcount.config import DiscoveryMode
from headcount.sim.apiserver import (
    ApiServerSim,
    ApiServerSimConfig,
    make_inference_pool,
    make_pod,
    running_apiserver,
)
from headcount.sim.cluster.flags import RouterFlags, Timings
from headcount.sim.engine import EngineSimConfig, SimEngine, start_engine
from headcount.sim.loopback import free_port_on_all

__all__ = ["ENGINE_LABELS", "SimCluster", "hosts", "sim_cluster"]

ENGINE_LABELS: Mapping[str, str] = {"app": "engine"}
"""Labels every engine pod carries, and what the router selects by default."""


def hosts(prefix: str, count: int) -> list[str]:
    """`count` loopback addresses: `hosts("127.0.1", 3)` is 127.0.1.1 to 127.0.1.3."""
    return [f"{prefix}.{n}" for n in range(1, count + 1)]


@dataclass
class SimCluster:
    """The emulator, the engines started for its pods, and how a router finds them."""

    api: ApiServerSim
    port: int
    """The engine port, free on every address the cluster was made for."""
    kubeconfig: Path
    namespace: str
    engines: dict[str, SimEngine] = field(default_factory=dict)
    """By the name they were started under (usually their pod's)."""

    def router_flags(self, timings: Timings | None = None) -> RouterFlags:
        """A router discovering this cluster's engine pods, with `timings`."""
        return RouterFlags(
            discovery=DiscoveryMode.K8S_PODS,
            kubeconfig=self.kubeconfig,
            namespace=self.namespace,
            label_selector=",".join(f"{key}={value}" for key, value in ENGINE_LABELS.items()),
            engine_port=self.port,
            timings=timings or Timings(),
        )

    def pool_router_flags(self, pool: str, timings: Timings | None = None) -> RouterFlags:
        """A router discovering the engine pods of the InferencePool `pool`, with `timings`."""
        return RouterFlags(
            discovery=DiscoveryMode.INFERENCE_POOL,
            inference_pool=pool,
            kubeconfig=self.kubeconfig,
            namespace=self.namespace,
            timings=timings or Timings(),
        )

    def apply_inference_pool(
        self,
        name: str,
        *,
        ports: Sequence[int] | None = None,
        match_labels: Mapping[str, str] | None = None,
        endpoint_picker: str | None = None,
    ) -> dict[str, Any]:
        """Create or replace an InferencePool: by default the engine pods on the cluster's port."""
        pool = make_inference_pool(
            name,
            namespace=self.namespace,
            match_labels=ENGINE_LABELS if match_labels is None else match_labels,
            ports=(self.port,) if ports is None else ports,
            endpoint_picker=endpoint_picker,
        )
        return self.api.apply(pool)

    def patch_inference_pool(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch to an InferencePool, e.g. ``{"spec": {"targetPorts": [...]}}``."""
        return self.api.patch("InferencePool", self.namespace, name, dict(patch))

    def delete_inference_pool(self, name: str) -> None:
        self.api.delete("InferencePool", self.namespace, name)

    async def start_engine(
        self, name: str, host: str, *, model: str, token_delay: float = 0.0
    ) -> SimEngine:
        """A simulated engine on `host` and the cluster's port, stopped with the cluster."""
        config = EngineSimConfig(
            host=host, port=self.port, model=model, name=name, token_delay=token_delay
        )
        engine = await start_engine(config)
        self.engines[name] = engine
        return engine

    def apply_pod(
        self,
        name: str,
        ip: str | None,
        *,
        model: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        ready: bool = True,
    ) -> dict[str, Any]:
        """Create or replace an engine pod (selected, labelled with `model` if given)."""
        all_labels = {**ENGINE_LABELS, **({"model": model} if model else {}), **(labels or {})}
        pod = make_pod(
            name,
            namespace=self.namespace,
            labels=all_labels,
            annotations=annotations,
            ip=ip,
            ready=ready,
            port=self.port,
        )
        return self.api.apply_pod(pod)

    async def add_engine(
        self, name: str, host: str, *, model: str, token_delay: float = 0.0
    ) -> SimEngine:
        """An engine on `host` and a Ready pod for it, both named `name`."""
        engine = await self.start_engine(name, host, model=model, token_delay=token_delay)
        self.apply_pod(name, host, model=model)
        return engine


@contextlib.asynccontextmanager
async def sim_cluster(
    workdir: Path,
    addresses: Iterable[str],
    *,
    namespace: str = "default",
    bookmark_interval: float = 0.5,
) -> AsyncIterator[SimCluster]:
    """An emulator and an engine port free on all `addresses`; engines stop on exit.

    The kubeconfig is written in `workdir`, its context in `namespace`.
    """
    port = free_port_on_all(list(addresses))
    async with running_apiserver(ApiServerSimConfig(bookmark_interval=bookmark_interval)) as api:
        kubeconfig = api.kubeconfig(workdir / "kubeconfig", namespace)
        cluster = SimCluster(api, port, kubeconfig, namespace)
        try:
            yield cluster
        finally:
            for engine in cluster.engines.values():
                await engine.stop()
