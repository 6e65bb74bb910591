"""The emulator's admin port answers through every fault, and its kubelet starts pods.

The kubelet on its own, on a fake sleep, is tests/unit/test_apiserver_kubelet.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from headcount.sim.apiserver import ApiServerSim, ApiServerSimConfig, running_apiserver
from tests.support import wait_until
from tests.support.apiserver import bare_pod, refused

TIMEOUT = aiohttp.ClientTimeout(total=5)


@pytest.fixture
async def sim() -> AsyncIterator[ApiServerSim]:
    config = ApiServerSimConfig(admin_port=0, kubelet=True, kubelet_delay=0)
    async with running_apiserver(config) as server:
        yield server


async def test_admin_port_edits_the_cluster_while_the_api_port_refuses(sim: ApiServerSim) -> None:
    admin = sim.admin_url
    assert admin is not None and admin != sim.url
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.put(f"{admin}/_sim/objects", json=bare_pod("engine-0")) as response:
            assert response.status == 200
        await wait_until(lambda: sim.pods()[0]["status"]["phase"] == "Running", timeout=5)
        async with http.post(f"{admin}/_sim/faults/refuse", json={"seconds": 60}) as response:
            assert response.status == 200
        await wait_until(lambda: refused(sim.url), timeout=5, what="the refusal")
        async with http.delete(f"{admin}/_sim/objects/pods/default/engine-0") as response:
            assert (await response.json())["refusing"] is True
        assert sim.pods() == []
        async with http.get(f"{admin}/version") as response:
            assert response.status == 404, "the admin port serves /_sim/ only"
        async with http.post(f"{admin}/_sim/faults/restore") as response:
            assert (await response.json())["refusing"] is False
        async with http.get(f"{sim.url}/version") as response:
            assert response.status == 200
