"""Running the soak: the cluster, engines and their chaos, the router, traffic, then the checks.

The method and the checks: bench/soak/__init__.py.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.harness import BenchError
from bench.common.processes import Proc, Processes
from bench.common.procfs import rss_and_fds
from bench.soak.chaos import Chaos, ChaosSettings
from bench.soak.report import FAILOVERS, RELISTS, Check, Result
from bench.soak.traffic import Mix, Outcome, run_traffic
from headcount.config import ProxySettings
from headcount.discovery.pods import pod_to_spec
from headcount.sim.cluster import (
    RouterClient,
    SimCluster,
    Timings,
    hosts,
    serve_command,
    sim_cluster,
    wait_until,
)
from headcount.sim.loopback import free_port

__all__ = ["ENGINES", "ROUTER_TIMINGS", "TOKEN_DELAY_S", "Soak"]

MODEL = "sim-model"
ENGINES = 4
NAMESPACE = "soak"
TOKEN_DELAY_S = 0.01
ROUTER_TIMINGS = Timings(
    probe_interval=1.0,
    backoff_initial=0.2,
    backoff_max=2.0,
    api_request_timeout=5.0,
    api_connect_timeout=1.0,
    watch_idle_timeout=5.0,
    drain_delay=0.0,
    drain_timeout=5.0,
)
"""Discovery and probes scaled down from production (watch idle 90 s, back-off 30 s, probes
5 s); the data plane's timeouts are production's."""
IDLE_PAUSE_S = ProxySettings().pool_idle_timeout + 2.0
"""Idle upstream connections are closed by then, so two measurements see the same sockets."""
FD_SLACK = 8
RSS_SLACK_MIB = 32.0
SAMPLE_EVERY_S = 1.0
QUICK_CHAOS = ChaosSettings(
    gap_s=(2.0, 4.0),
    down_s=(2.0, 5.0),
    hang_s=(3.0, 35.0),
    blackhole_s=(3.0, 8.0),
    blackhole_spacing_s=5.0,
)


def _truth(cluster: SimCluster) -> set[str]:
    """Uids of the pods that are engines, by the router's own pure mapping of a pod."""
    return {
        str(pod["metadata"]["uid"])
        for pod in cluster.api.pods(cluster.namespace)
        if pod_to_spec(pod, source="k8s-pods", engine_port=cluster.port) is not None
    }


def _metric(text: str, name: str) -> dict[str, float]:
    """Samples of `name` by their label set (`""` for none)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            labels, _, value = line[len(name) :].rpartition(" ")
            found[labels.strip("{}")] = found.get(labels.strip("{}"), 0.0) + float(value)
    return found


class Soak:
    def __init__(self, args: argparse.Namespace, procs: Processes, log_dir: Path) -> None:
        self.args = args
        self.procs = procs
        self.log_dir = log_dir
        self.result = Result()
        self.samples: list[tuple[float, float, int]] = []

    async def run(self) -> Result:
        addresses = hosts("127.0.1", ENGINES)
        async with sim_cluster(
            self.log_dir, addresses, namespace=NAMESPACE, bookmark_interval=0.5
        ) as cluster:
            client, router = await self._start(cluster, addresses)
            try:
                await self._soak(cluster, client, router)
            finally:
                await asyncio.to_thread(self.procs.stop, router)
        return self.result

    async def _start(self, cluster: SimCluster, addresses: list[str]) -> tuple[RouterClient, Proc]:
        settings = QUICK_CHAOS if self.args.quick else ChaosSettings()
        port = free_port()
        client = RouterClient(f"http://127.0.0.1:{port}", timeout=5.0)

        async def converged() -> bool:
            engines = await client.engines()
            return {e["id"] for e in engines} == _truth(cluster)

        chaos = Chaos(
            cluster=cluster,
            procs=self.procs,
            model=MODEL,
            token_delay=TOKEN_DELAY_S,
            settings=settings,
            converged=converged,
            rng=random.Random(self.args.seed),
        )
        self.result.chaos = chaos
        await chaos.start_engines([f"engine-{i}" for i in range(ENGINES)], addresses)
        flags = cluster.router_flags(ROUTER_TIMINGS)
        command = serve_command(flags, host="127.0.0.1", port=port, program=self.args.program)
        router = self.procs.start("router", command)
        await self._until(lambda: self._all_ready(client, cluster), 30, "every engine ready")
        return client, router

    async def _all_ready(self, client: RouterClient, cluster: SimCluster) -> bool:
        engines = await client.engines()
        ids = {e["id"] for e in engines}
        return ids == _truth(cluster) and all(e["state"] == "ready" for e in engines)

    async def _until(self, condition: Any, timeout: float, what: str) -> None:
        try:
            await wait_until(condition, timeout=timeout, interval=0.2, what=what)
        except TimeoutError as exc:
            raise BenchError(str(exc)) from None

    async def _soak(self, cluster: SimCluster, client: RouterClient, router: Proc) -> None:
        args, result = self.args, self.result
        chaos = result.chaos
        assert chaos is not None
        mix = Mix(rate=args.rate)
        warm: list[Outcome] = []
        warm_until = time.monotonic() + args.warmup
        await run_traffic(client.url, MODEL, mix, warm_until, asyncio.Event(), 0, warm)
        await asyncio.sleep(IDLE_PAUSE_S)
        result.baseline = rss_and_fds(router.pid)
        sampler = asyncio.create_task(self._sample(router))
        result.t0 = time.monotonic()
        until = result.t0 + args.duration
        stop = asyncio.Event()
        traffic = asyncio.create_task(
            run_traffic(client.url, MODEL, mix, until, stop, args.seed + 1, result.outcomes)
        )
        await chaos.run(until)
        await traffic
        await chaos.heal()
        result.elapsed_s = time.monotonic() - result.t0
        converged = await self._converged(client, cluster)
        await asyncio.sleep(IDLE_PAUSE_S)
        sampler.cancel()
        result.final = rss_and_fds(router.pid)
        result.checks = await self._checks(client, router, converged)

    async def _sample(self, router: Proc) -> None:
        while True:
            measured = rss_and_fds(router.pid)
            if measured is not None:
                self.samples.append((time.monotonic(), *measured))
                self.result.peak_rss_mib = max(self.result.peak_rss_mib, measured[0])
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def _converged(self, client: RouterClient, cluster: SimCluster) -> float | None:
        started = time.monotonic()
        try:
            await wait_until(
                lambda: self._all_ready(client, cluster), timeout=60, interval=0.2, what="truth"
            )
        except TimeoutError:
            return None
        return time.monotonic() - started

    async def _checks(
        self, client: RouterClient, router: Proc, converged: float | None
    ) -> list[Check]:
        result, chaos = self.result, self.result.chaos
        assert chaos is not None
        timeline = chaos.timeline
        for outcome in result.outcomes:
            if outcome.kind == "failed":
                if timeline.healthy_engine_existed(outcome.start, outcome.end):
                    result.failed_with_healthy.append(outcome)
                else:
                    result.excused.append(outcome)
        checks = [
            Check(
                "no request failed while a healthy engine existed",
                not result.failed_with_healthy,
                _failure_summary(result.failed_with_healthy),
            ),
            Check(
                "the router never exited",
                router.alive(),
                "alive" if router.alive() else f"exited: {router.log_tail(3)}",
            ),
            Check(
                "the router matched the truth after healing (every engine ready)",
                converged is not None,
                f"after {converged:.1f} s" if converged is not None else "not within 60 s",
            ),
            Check(
                "the router matched the truth after every API outage",
                all(truth is not None for _, truth in chaos.outages),
                f"{len(chaos.outages)} outage(s)",
            ),
        ]
        if router.alive():
            checks += await self._counter_checks(client)
        checks += self._resource_checks()
        return checks

    async def _counter_checks(self, client: RouterClient) -> list[Check]:
        chaos = self.result.chaos
        assert chaos is not None
        in_flight: dict[str, int] = {}
        try:
            engines = await client.engines()
            in_flight = {e["name"]: int(e["in_flight"]) for e in engines}
            text = await client.metrics()
        except Exception as exc:  # the router is judged from outside; any failure is a finding
            return [Check("router in-flight counters at zero", False, f"unreadable: {exc!r}")]
        self.result.metrics = {name: _metric(text, name) for name in (FAILOVERS, RELISTS)}
        gauge = sum(_metric(text, "headcount_engine_in_flight").values())
        engine_stats = await asyncio.gather(
            *(self._sim_stats(chaos.engine_url(slot)) for slot in chaos.slots)
        )
        busy = {
            slot.name: stats
            for slot, stats in zip(chaos.slots, engine_stats, strict=True)
            if stats is None or any(stats.get(k) for k in ("in_flight", "running", "waiting"))
        }
        return [
            Check(
                "router in-flight counters at zero (/engines and headcount_engine_in_flight)",
                not any(in_flight.values()) and gauge == 0,
                f"/engines {in_flight}, gauge sum {gauge:g}",
            ),
            Check(
                "every engine's own in-flight, running and waiting at zero",
                not busy,
                "all zero" if not busy else f"not zero or unreadable: {busy}",
            ),
        ]

    async def _sim_stats(self, url: str) -> dict[str, Any] | None:
        try:
            body = await RouterClient(url, timeout=5.0).get_json("/sim/stats")
        except Exception:  # an engine that cannot say is reported as such
            return None
        return body if isinstance(body, dict) else None

    def _resource_checks(self) -> list[Check]:
        base, final = self.result.baseline, self.result.final
        if base is None or final is None:
            return [Check("RSS and fds back to baseline", False, "not measured")]
        return [
            Check(
                f"open fds back to baseline (within {FD_SLACK})",
                final[1] <= base[1] + FD_SLACK,
                f"{base[1]} -> {final[1]}",
            ),
            Check(
                f"RSS back to baseline (within {RSS_SLACK_MIB:g} MiB)",
                final[0] <= base[0] + RSS_SLACK_MIB,
                f"{base[0]:.1f} -> {final[0]:.1f} MiB (peak {self.result.peak_rss_mib:.1f})",
            ),
        ]


def _failure_summary(failures: Sequence[Outcome]) -> str:
    if not failures:
        return "none"
    kinds = Counter(_gist(o.detail) for o in failures)
    return f"{len(failures)}: " + "; ".join(f"{n} x {k}" for k, n in kinds.most_common(4))


def _gist(detail: str) -> str:
    """A failure's kind without its specifics (request numbers, bodies)."""
    return detail.split(":")[0][:60]
