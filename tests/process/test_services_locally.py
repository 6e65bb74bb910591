"""Services mode carries traffic on one machine: `--resolve` answers a Service's name locally.

In services mode an engine's URL is its Service's cluster DNS name, which no
DNS on a laptop knows; `--resolve NAME=ADDRESS` pins the name to the
loopback address a simulated engine listens on, so a chat goes through the
real router process, discovered from the API server emulator.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from headcount.config import DiscoveryMode
from headcount.sim.apiserver import make_endpointslice, make_service
from headcount.sim.cluster import RouterProcess, Timings, hosts, sim_cluster
from tests.support import wait_until

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

MODEL = "sim-model"


async def test_a_pinned_service_name_carries_a_chat_to_its_engine(tmp_path: Path) -> None:
    (address,) = hosts("127.0.13", 1)
    async with sim_cluster(tmp_path, [address]) as cluster:
        engine = await cluster.start_engine("vllm", address, model=MODEL)
        labels = {"app": "engine"}
        cluster.api.apply_service(
            make_service("vllm", namespace=cluster.namespace, labels=labels, ports=[cluster.port])
        )
        cluster.api.apply_endpointslice(
            make_endpointslice("vllm", [(address, True)], cluster.port, namespace=cluster.namespace)
        )
        flags = dataclasses.replace(
            cluster.router_flags(Timings(probe_interval=0.2, drain_delay=0)),
            discovery=DiscoveryMode.K8S_SERVICES,
            resolve=(f"vllm.{cluster.namespace}={address}",),
        )
        async with RouterProcess(flags) as router:
            await wait_until(
                lambda: router.client.routable(MODEL), timeout=10, what="the Service routable"
            )
            status, body = await router.client.chat(MODEL)
            assert status == 200, body
            engines = await router.client.engines()
            assert [view["url"] for view in engines] == [
                f"http://vllm.{cluster.namespace}:{cluster.port}"
            ]
            assert engine.stats()["served"] >= 1
