"""One simulated cluster for scenario tests, the demo and the benchmarks: emulator, engines, router.

The API server emulator and simulated engines on loopback addresses
(`sim_cluster`), `headcount serve` as a real child process whose command line
is built from a typed description (`RouterProcess`, `RouterFlags`,
`Timings`), a client for the router's own endpoints (`RouterClient`), steady
bounded traffic (`steady_traffic`) and one way to wait (`wait_until`)::

    async with sim_cluster(workdir, hosts("127.0.1", 2)) as cluster:
        await cluster.add_engine("a", "127.0.1.1", model="model-a")
        await cluster.add_engine("b", "127.0.1.2", model="model-a")
        flags = cluster.router_flags(Timings(probe_interval=0.5, drain_delay=0))
        async with RouterProcess(flags) as router:
            await wait_until(lambda: router.client.routable("model-a"), timeout=10)
            async with steady_traffic(router.url, "model-a", max_seconds=20) as traffic:
                cluster.api.delete_pod(cluster.namespace, "b")
                await wait_until(lambda: traffic.ok >= 20)
            assert traffic.failures == [] and traffic.cut == 0
"""

from headcount.sim.cluster.client import RouterClient
from headcount.sim.cluster.flags import PYTHON_CLI, RouterFlags, Timings, serve_command
from headcount.sim.cluster.k8s import ENGINE_LABELS, SimCluster, hosts, sim_cluster
from headcount.sim.cluster.polling import wait_until
from headcount.sim.cluster.process import RouterProcess
from headcount.sim.cluster.traffic import Traffic, steady_traffic

__all__ = [
    "ENGINE_LABELS",
    "PYTHON_CLI",
    "RouterClient",
    "RouterFlags",
    "RouterProcess",
    "SimCluster",
    "Timings",
    "Traffic",
    "hosts",
    "serve_command",
    "sim_cluster",
    "steady_traffic",
    "wait_until",
]
