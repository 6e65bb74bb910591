"""Measure what hostile clients and broken engines cost everyone else: loop stalls, latency, memory.

Method (the numbers are only as good as this):

- The run re-executes itself in a private network namespace (`unshare --net`,
  loopback only). Started once: one healthy engine (`python -m
  headcount.sim.engine`, model `sim-model`, on 127.0.0.1) and one adversarial engine
  (`bench/hostile/programs/evil_engine.py`, model `evil-model` unless a phase says otherwise, so
  normal traffic never reaches it; on 127.0.0.2, so the KV-event ports a router looks
  for on its host are the adversary's alone).
- Each phase gets a fresh `headcount serve --discovery static` over both engines
  (built with `headcount.sim.cluster.RouterFlags`; probe interval 1 s so the probe
  attacks recur; every other setting is the router's default), and runs:
  warm-up (normal traffic only; its last second is the baseline), the attack,
  then an aftermath with the attack stopped. The measured window is attack +
  aftermath; the `quiet` phase is the same with no attack, measured first.
- Beside every attack, the observer (`bench/hostile/programs/observer.py`, its own process,
  connecting from 127.0.0.3 while the attacks come from 127.0.0.1) keeps
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

Issue 17's phases (h-m) attack what the router gained since: client keys, the
engines' KV-event streams, its own tokenizer, the parse workers. Their router
differs from the default where the attack needs it: h-keyless takes client keys
(`--api-keys-file`, a key written into the log directory) and has an
`--admin-port` (the observer's chats carry the key, its `/livez` goes to the
admin port; the attack holds keyless heads on both ports); i-kv-frame, i-kv-flood,
j-kv-index, k and m route `kv-aware` (i, j, k with `--tokenizer builtin`, m asking
the engines' `/tokenize`), with KV-event ports that an attack's publisher
(`bench/hostile/programs/kv_attacks.py`) binds on the adversarial engine's address.
Targets: worst stall < 50 ms; the memory bounds above (j-kv-index may add the
index's own memory bound as `/engines` shows it, `memory_limit_bytes`, or 64
bytes per block stored where it shows none); no failed normal request
(nor 200 KB prompt in l-parse-fair); h: no keyed request answered 503; m: no
chat waiting out the 1 s tokenize timeout. Staged attacks (i, j) mark when each
stage began, and the report gives each stage's slowest `/livez`, RSS and router
CPU, so the stall of an 8 MiB frame is not the 32 MiB one's, and j gives the
index's RSS per million blocks. A run of `/livez` calls the client gave up on
(at the client timeout) counts as one stall, until the answer that ended it.

Usage: `.venv/bin/python -m bench.hostile [--quick] [--phases a,b,f-header,...]`.
Exit 0 when every phase was measured, 2 on a setup error. The report is printed
and written to `bench/out/hostile-<timestamp>.md`, every process's log and the raw
samples in `bench/out/hostile-<timestamp>-logs/`.
"""
