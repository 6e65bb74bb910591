"""A chaos soak: does the router end clean after minutes of mixed traffic through broken engines?

Method (the verdict is only as good as this):

- The run re-executes itself in a private network namespace (`unshare --net`,
  loopback only). The API server emulator (`headcount.sim.cluster.sim_cluster`)
  runs on the benchmark's own loop; 4 engines run as processes (`python -m
  headcount.sim.engine`, token delay 10 ms), each on its own loopback IP with a
  pod; `headcount serve --discovery k8s-pods` runs as a process on the cluster's
  kubeconfig, with production defaults except discovery and probe timings scaled
  down (`ROUTER_TIMINGS`) so that ten minutes hold many recoveries.
- Traffic (`bench/soak/traffic.py`): open loop, Poisson arrivals at `--rate`,
  half streaming, 10% abandoned by the client on purpose; each request ends ok,
  aborted, cut (its answer began, then broke) or failed.
- Chaos (`bench/soak/chaos.py`), seeded: engines killed (and their pods deleted, then
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

Usage: `.venv/bin/python -m bench.soak [--duration 600] [--quick] [--rate 20] [--seed 1]
[--baseline REV]` (`--baseline`: the router as it was at a git revision).
The report (`bench/soak/report.py`) is printed and written to
`bench/out/soak-<timestamp>.md`, logs beside it.
Exit 0 all checks pass, 1 one failed, 2 setup error.
"""
