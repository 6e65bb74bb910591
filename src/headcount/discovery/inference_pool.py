"""Engines from a Gateway API Inference Extension `InferencePool`: its pods, on its ports.

`pool_spec.pool_target` reads what a pool (inference.networking.k8s.io/v1) says
about its members: `spec.selector.matchLabels` picks the pods, `spec.targetPorts`
(1 to 8) are the ports each one serves on. `pool_engines` maps one pod through the pod
mapping (`pods.pod_engine`) to one engine per target port, named as the
reference endpoint picker names its endpoints (`<pod>-rank-<index of the port>`),
identified by the pod's UID and the port (a port changed is another engine).

`InferencePoolSource` runs two reflectors, one over the namespace's pools (the
one named is kept) and one over the namespace's pods, and joins them: a LIST on
either side is a full reconcile, a pod event recomputes that pod's engines, a
pool event (selector or ports changed, pool deleted) recomputes them all. A
pool that does not exist leaves the fleet empty and says so in the status
(`missing`), which `/health` shows; it is picked up when it is created.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from headcount.clock import Clock, Sleep
from headcount.config import EngineScheme
from headcount.discovery.isolation import Isolation
from headcount.discovery.joined import Joined, Side
from headcount.discovery.listwatch import KubeObject, ListerWatcher
from headcount.discovery.pods import (
    apply_engines,
    deleted_reason,
    not_an_engine,
    pod_engine,
    reconcile_observed,
)
from headcount.discovery.reflector import ReflectorTiming
from headcount.discovery.source import NotAnEngine, SourceStatus, Watched
from headcount.fleet import EngineSpec, Fleet
from headcount.pool_spec import PoolTarget, pool_target

__all__ = [
    "InferencePoolSource",
    "engine_ids",
    "pool_engines",
]


def engine_ids(uid: str, target: PoolTarget) -> list[str]:
    """The ids of the engines a pod `uid` stands for in a pool: one per target port."""
    return [f"{uid}:{port}" for port in target.ports]


def pool_engines(
    pod: KubeObject,
    target: PoolTarget,
    *,
    source: str,
    scheme: EngineScheme = EngineScheme.HTTP,
) -> list[EngineSpec] | str:
    """The engines a pod stands for (one per target port), or why it is none (raises if
    malformed). The caller checks that the pool selects the pod."""
    engines: list[EngineSpec] = []
    for rank, (engine_id, port) in enumerate(
        zip(engine_ids(str(pod["metadata"]["uid"]), target), target.ports, strict=True)
    ):
        engine = pod_engine(pod, source=source, engine_port=port, scheme=scheme)
        if isinstance(engine, str):
            return engine
        engines.append(replace(engine, id=engine_id, name=f"{engine.name}-rank-{rank}"))
    return engines


_Observed = list[EngineSpec] | NotAnEngine


class InferencePoolSource:
    """Keeps the fleet's engines of `status.name` equal to the pool's ready pods on its ports."""

    def __init__(
        self,
        fleet: Fleet,
        pools: ListerWatcher,
        pods: ListerWatcher,
        *,
        pool: str,
        namespace: str,
        label_selector: str,
        timing: ReflectorTiming,
        scheme: EngineScheme = EngineScheme.HTTP,
        name: str = "inference-pool",
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """`pools` and `pods` list in `namespace`; `label_selector` narrows the pods listed
        (server-side) before the pool's selector picks among them."""
        self.status = SourceStatus(name=name, kind="inference-pool")
        self._fleet = fleet
        self._pool = pool
        self._namespace = namespace
        self._scheme = scheme
        self._isolation = Isolation(name)
        self._target: PoolTarget | None = None
        self._pods: dict[str, KubeObject] = {}
        self._set_target(None, f"inference pool {pool} not listed yet in namespace {namespace}")
        self._joined = Joined(
            self.status,
            (
                Side("inferencepools", pools, "", self._on_pools_list, self._on_pool_event),
                Side("pods", pods, label_selector, self._on_pods_list, self._on_pod_event),
            ),
            timing=timing,
            clock=clock,
            sleep=sleep,
        )

    async def run(self) -> None:
        await self._joined.run()

    def _on_pools_list(self, pools: list[KubeObject]) -> None:
        named = [pool for pool in pools if pool["metadata"].get("name") == self._pool]
        self._read_pool(named[0] if named else None)
        self._reconcile()

    def _on_pool_event(self, kind: str, pool: KubeObject) -> None:
        if pool["metadata"].get("name") != self._pool:
            return
        before = self._target
        self._read_pool(None if kind == "DELETED" else pool)
        if self._target != before:
            what = "deleted" if kind == "DELETED" else "changed"
            self._reconcile(f"inference pool {self._pool} {what}")

    def _on_pods_list(self, pods: list[KubeObject]) -> None:
        self._pods = {}
        for pod in pods:
            self._isolation.apply(self._store_pod, pod)
        self._reconcile()

    def _on_pod_event(self, kind: str, pod: KubeObject) -> None:
        uid = str(pod["metadata"]["uid"])
        if kind == "DELETED":
            self._pods.pop(uid, None)
        else:
            self._pods[uid] = pod
        target = self._target
        if not self._joined.listed or target is None:
            return
        observed = None if kind == "DELETED" else self._observe(pod, target)
        gone = deleted_reason(pod, "pod")
        if observed is None and kind != "DELETED":
            gone = "pod no longer selected by the inference pool"
        ids = engine_ids(uid, target)
        apply_engines(self._fleet, self.status, uid, observed, ids, gone)

    def _store_pod(self, pod: KubeObject) -> None:
        self._pods[str(pod["metadata"]["uid"])] = pod

    def _read_pool(self, pool: KubeObject | None) -> None:
        where = f"in namespace {self._namespace}"
        if pool is None:
            self._set_target(None, f"inference pool {self._pool} not found {where}")
            return
        try:
            target = pool_target(pool)
        except (ValueError, TypeError, AttributeError) as exc:
            self._isolation.reject(pool, str(exc))
            self._set_target(None, f"inference pool {self._pool} {where} is invalid: {exc}")
            return
        self._set_target(target, None)

    def _set_target(self, target: PoolTarget | None, missing: str | None) -> None:
        self._target = target
        self.status.missing = missing
        self.status.watches = Watched(
            "pods",
            namespace=self._namespace,
            label_selector=None if target is None else target.selector,
            also=("inferencepools",),
        )

    def _observe(self, pod: KubeObject, target: PoolTarget) -> _Observed | None:
        """The pod's engines, or why it has none; None when the pool does not select it."""
        selected = self._isolation.apply(lambda each: target.selects(_labels(each)), pod)
        if selected is False:
            return None
        engines = self._isolation.apply(
            lambda each: pool_engines(each, target, source=self.status.name, scheme=self._scheme),
            pod,
        )
        if isinstance(engines, list):
            return engines
        return not_an_engine(pod, "pod", "malformed" if engines is None else engines)

    def _reconcile(self, cause: str | None = None) -> None:
        """A LIST on either side, or the pool changed: the fleet made equal to the join."""
        if not self._joined.listed:
            return
        observed: list[EngineSpec | NotAnEngine] = []
        target = self._target
        if target is not None:
            for pod in self._pods.values():
                each = self._observe(pod, target)
                observed.extend(each if isinstance(each, list) else [] if each is None else [each])
        reconcile_observed(self._fleet, self.status, observed, cause)


def _labels(pod: KubeObject) -> Mapping[str, Any]:
    labels = pod["metadata"].get("labels") or {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"metadata.labels is a {type(labels).__name__}, not a map")
    return labels
