"""Measure what hostile clients and broken engines cost everyone else: loop stalls, latency, memory.

Method (the numbers are only as good as this):

- The run re-executes itself in a private network namespace (`unshare --net`,
  loopback only). Started once: one healthy engine (`python -m
  headcount.sim.engine`, model `sim-model`) and one adversarial engine
  (`bench/hostile/programs/evil_engine.py`, model `evil-model` unless a phase says otherwise, so
  normal traffic never reaches it).
- Each phase gets a fresh `headcount serve --discovery static` over both engines
  (built with `headcount.sim.cluster.RouterFlags`; probe interval 1 s so the probe
  attacks recur; every other setting is the router's default), and runs:
  warm-up (normal traffic only; its last second is the baseline), the attack,
  then an aftermath with the attack stopped. The measured window is attack +
  aftermath; the `quiet` phase is the same with no attack, measured first.
- Beside every attack, the observer (`bench/hostile/programs/observer.py`, its own process) keeps
  a `GET /livez` on one keep-alive connection every 5 ms (the router answers it
  itself: its latency is how long the event loop takes to get to it) and 50 small
  `sim-model` chats per second, open loop. *Worst stall* = the slowest `/livez` in
  the window minus the quiet phase's median. Normal p50/p99 cover every request
  started in the window, failures at the time they failed.
- The benchmark samples the router's VmRSS and open fds (`/proc/<pid>/status`,
  `/proc/<pid>/fd`) every 100 ms: peak over the baseline, and *after* = the median
  of the window's last second over the baseline (does it come back?).
- The attacks (`bench/hostile/programs/attacks.py`, their own process) and the adversarial engine
  run at nice 10: their own CPU use on 2 shared cores should not pass for the
  router's stalls. What each attack does is in that module's docstring; the
  adversarial engine's answers in `bench/hostile/programs/evil_engine.py`.
- Targets (from issue 8), per phase: worst stall < 20 ms; peak RSS over baseline
  <= 2 x the body limit per concurrent upload (one body limit's worth twice for a
  phase without uploads), and for the 2-byte chunks at most twice the body bytes
  the heaviest wave sent (+16 MiB): buffers proportional to the bytes actually
  held; RSS after within one body limit of the baseline; fds
  after within 5 of it; normal p99 <= quiet p99 + 20 ms; no failed normal request;
  and the phase's own check (no planted response reached a client; an engine with
  nested JSON models fails its probes; requests on a hung engine are answered,
  within 1 s of the router showing it unhealthy or ejected if it did). A missed
  target is reported, not an error.
  The records, the verdict and the report: `bench/hostile/report.py`.

Usage: `.venv/bin/python -m bench.hostile [--quick] [--phases a,b,f-header,...]`.
Exit 0 when every phase was measured, 2 on a setup error. The report is printed
and written to `bench/out/hostile-<timestamp>.md`, every process's log and the raw
samples in `bench/out/hostile-<timestamp>-logs/`.
"""
