"""A chaos soak: does the router end clean after minutes of mixed traffic through broken engines?

Method (the verdict is only as good as this):

- The run re-executes itself in a private network namespace (`unshare --net`,
  loopback only). The API server emulator (`headcount.sim.cluster.sim_cluster`)
  runs on this script's loop; 4 engines run as processes (`python -m
  headcount.sim.engine`, token delay 10 ms), each on its own loopback IP with a
  pod; `headcount serve --discovery k8s-pods` runs as a process on the cluster's
  kubeconfig, with production defaults except discovery and probe timings scaled
  down (`ROUTER_TIMINGS`) so that ten minutes hold many recoveries.
- Traffic (`bench/_soak_traffic.py`): open loop, Poisson arrivals at `--rate`,
  half streaming, 10% abandoned by the client on purpose; each request ends ok,
  aborted, cut (its answer began, then broke) or failed.
- Chaos (`bench/_chaos.py`), seeded: engines killed (and their pods deleted, then
  replaced), restarted, hung, their pods flapping Ready/NotReady, the API server
  blackholed; at least one engine stays healthy throughout, as the router could
  know it, and each request is judged by that timeline.
- Baselines: after a warm-up and an idle pause longer than the upstream pool's
  idle timeout, the router's RSS and open fds. At the end the traffic stops,
  every fault heals, the router must match the truth (every engine ready), and
  after the same idle pause it is measured again.

Checks (exit 1 if one fails, naming it): no request failed while a healthy
engine existed (cut answers are counted apart); every in-flight counter at zero
(the router's `/engines` and `headcount_engine_in_flight`, each engine's own
`/sim/stats`); fds within 8 and RSS within 32 MiB of the baseline; the router
matched the truth after every API outage and after healing; it never exited.

Usage: `.venv/bin/python bench/soak.py [--duration 600] [--quick] [--rate 20] [--seed 1]
[--baseline REV]` (`--baseline`: the router as it was at a git revision).
The report (`bench/_soak_report.py`) is printed and written to
`bench/out/soak-<timestamp>.md`, logs beside it.
Exit 0 all checks pass, 1 one failed, 2 setup error.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import platform
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop
from _chaos import Chaos, ChaosSettings
from _harness import (
    BenchError,
    Proc,
    Processes,
    free_port,
    router_program,
    rss_and_fds,
    run_benchmark,
)
from _soak_report import FAILOVERS, RELISTS, Check, Result, render
from _soak_traffic import Mix, Outcome, run_traffic

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

__all__ = ["main"]

BENCH = Path(__file__).resolve().parent
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


# --- report -----------------------------------------------------------------------


def _setup(args: argparse.Namespace, result: Result, log_dir: Path) -> list[str]:
    return [
        f"- headcount: {args.source}",
        f"- {args.duration:g} s of chaos (ran {result.elapsed_s:.0f} s with healing), seed "
        f"{args.seed}; {ENGINES} engines (token delay {TOKEN_DELAY_S * 1000:g} ms), router "
        f"`--discovery k8s-pods {_timings()}`",
        f"- traffic: {args.rate:g} requests/s (Poisson), half streaming, 10% abandoned by the "
        f"client; client timeout {Mix().timeout_s:g} s",
        f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
        f"{platform.python_version()}; logs: {log_dir}",
    ]


def _timings() -> str:
    """The timings set on the router, as its flags spell them."""
    return " ".join(
        f"--{each.name.replace('_', '-')}={value:g}"
        for each in dataclasses.fields(ROUTER_TIMINGS)
        if (value := getattr(ROUTER_TIMINGS, each.name)) is not None
    )


# --- command line -----------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, help="seconds of chaos (default 600; quick 60)")
    parser.add_argument("--quick", action="store_true", help="60 s, faults more often")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of traffic first")
    parser.add_argument("--seed", type=int, default=1, help="the chaos schedule and traffic")
    parser.add_argument(
        "--baseline", metavar="REV", help="run the router as it was at git revision REV"
    )
    parser.add_argument("--out", type=Path, default=BENCH / "out", help="report directory")
    parser.add_argument(
        "--no-netns", action="store_true", help="stay in the host's network namespace"
    )
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 60.0 if args.quick else 600.0
    if args.duration <= 0 or args.rate <= 0:
        parser.error("--duration and --rate must be positive")
    return args


def _run(args: argparse.Namespace) -> int:
    args.program, args.source = router_program(args.baseline, args.out)
    started = datetime.datetime.now(datetime.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"soak-{stamp}-logs"
    with Processes(log_dir) as procs:
        soak = Soak(args, procs, log_dir)
        result = uvloop.run(soak.run())
    (log_dir / "samples.json").write_text(json.dumps(soak.samples))
    report = render(result, _setup(args, result, log_dir), started.strftime("%Y-%m-%d %H:%M"))
    path = args.out / f"soak-{stamp}.md"
    path.write_text(report)
    print(report)
    failed = [check.name for check in result.checks if not check.ok]
    for name in failed:
        print(f"check failed: {name}", file=sys.stderr)
    print(f"report: {path}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    return run_benchmark(lambda: _run(args), args.no_netns)


if __name__ == "__main__":
    sys.exit(main())
