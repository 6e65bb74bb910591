"""Measure Kubernetes discovery at scale: how fast the fleet learns the truth, and what it costs.

Method (the numbers are only as good as this):

- Three processes share the 2 cores: the API emulator (`python -m
  headcount.sim.apiserver`), the driver (`python -m bench.discovery`: creates,
  patches and deletes pods through the emulator's admin API, injects faults,
  times them) and one *worker* per run (`programs/worker.py`), the measured side: a
  real `Fleet` and the pod source from `build_k8s_source` (kubernetes_asyncio
  lister-watcher, reflector, `PodSource`) on uvloop, as `headcount serve` runs
  it. No Prober: engines stay `pending`, membership is what is measured. The
  driver and the worker talk over the worker's stdin/stdout (JSON lines);
  times on both sides are CLOCK_MONOTONIC, one clock for the whole machine.
- Pods are created once per size (bounded concurrency over HTTP), label
  `app=vllm` selected. Each run starts a fresh worker and measures, in order:
  1. initial sync: source started -> first LIST applied (`status.synced`,
     fleet holds N). RSS: VmHWM (reset through /proc/self/clear_refs) minus
     VmRSS before the start, in the fresh worker process.
  2. no-change relist: the watch has lived past `short_watch` (else a clean
     end is a very short watch and backs off); the driver ends every watch
     (`drop-watches`, a clean EOF) and the time runs to the relist's LIST being
     applied (`relists[watch-ended]` +1, `last_list_success` past the drop).
     Every `FleetChange.to_probe` in that window is counted: it must be 0.
  3. watch events/s, M label changes (`model`, so each one is a changed
     engine), two ways: *burst*: the watch is stalled, the M patches queue in
     the emulator, then `restore` and the clock runs to the M-th change applied
     (the router's drain rate; its CPU share says whether it was the limit);
     *live*: the driver sends the M patches as fast as it can (16 in flight)
     and the clock runs from the first sent to the M-th applied (end to end).
     Each again *with a reader*: `fleet.snapshot` read once per loop turn that
     changed the fleet, as request traffic does (a read after a write rebuilds
     the snapshot, O(N log N)).
  4. tracemalloc peak: a second fresh fleet and source synced under
     tracemalloc (its timing is not reported: tracing slows Python ~3x).
  5. time to truth after a blind period: the watch is stalled, 10% of the
     pods are deleted (the DELETED events queue in the emulator and are never
     sent), then the server refuses connections for S seconds (which aborts
     the stalled watch: the queued events are lost, the router is blind to
     the deletions); it restores itself. The driver polls TCP connects to time
     the API reachable again; the clock runs to the fleet equal to the truth
     (all deleted engines removed by the relist). Back-off: production's
     initial 0.8 s, `backoff_max` scaled down from 30 s to 1 s. S is drawn in
     [2.5, 3.5] s so the retry phase is not the same every run.
- Where a LIST's time goes: the worker wraps `KubeListerWatcher.list`,
  `kube._parse_list`, `PodSource._on_list` and `pods.reconcile_listed` with
  timers (behaviour unchanged) and counts the cyclic GC's time (`gc.callbacks`).
- Medians over `--runs` runs. `--profile` adds one cProfile'd run at the
  largest size and prints where the worker's time went, per phase.
  `--backoff-max 30` measures time to truth with production's back-off.

The modules: `scenario.py` runs the emulator and the workers, `measure.py` times
the phases from the driver, `programs/worker.py` is the worker (what it wraps
around the router to time it: `instruments.py`), `report.py` writes the report,
`__main__.py` is the command line.

Usage: `.venv/bin/python -m bench.discovery [--sizes 100,1000,5000] [--runs 3]
[--events 2000] [--quick] [--profile] [--backoff-max S]`. The report is printed and written to
`bench/out/discovery-<timestamp>.md`, logs beside it.
"""
