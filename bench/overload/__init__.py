"""Measure what happens when demand exceeds the fleet: who waits, who is refused, who is served.

Method (the numbers are only as good as this):

- Private network namespace, loopback only (as bench/overhead).
- Fleet (`fleet.py`): 4 `headcount sim-engine`s, `--max-running 4` each (16
  slots; more requests wait in the engine's own queue, as vLLM's do), 50 ms per
  output token, 10 output tokens a request: a service time of 0.5 s, so the
  fleet serves at most 32 requests/s.
- Tenants (`tenants.py`; the same declaration renders headcount-flow's tenants
  file and drives the load), every request a streamed chat with its tenant's key:
  - `interactive` (priority 10): open loop, Poisson at 40 % of capacity (12.8/s);
  - `batch-a`, `batch-b` (priority 0, weights 1 and 2): closed loop, 24 workers
    each, 48 in all, 3x the fleet's slots: the flood. Equal workers, so without
    flow control each gets half the engines' time whatever its weight;
  - `capped` (`tokens_per_minute = 20000`, priority 0, weight 1): 4 closed-loop
    workers, wanting ~8 requests/s where 49 a minute fit. The priority-0 tenants
    all send ~410-token requests (400-word prompts): fair shares are counted in
    tokens, so with short batch prompts `capped`'s quarter share would hold it
    below its limit and the limit would go untested;
  - `sheddable` (priority -1): open loop at 25 % of capacity, in the second part
    of the window only (`late`).
  A closed-loop worker refused waits `Retry-After`, at most 0.25 s.
- Targets (`targets.py`), one at a time over the same engines: `fleet-alone`
  (headcount, only the interactive tenant: its unloaded TTFT), `headcount` (no
  tenants file: the flood lands in the engines' queues), `headcount-flow` (the
  tenants file, flow control's defaults), `vllm-router` (round_robin with its
  limiter: one token bucket of 16 in-flight requests, a FIFO queue of 1,000 with
  a 30 s timeout, refill 1/s; global, not per key, no priority, no token limits).
- Per target: load points first (interactive plus the batch flood at each
  `--points` multiple of capacity, for the plot), then the main run: every tenant
  at the 3x flood (`fleet-alone`: one run, twice a load point's window). A
  router's first run warms up 10 s longer: flow control learns each engine's
  capacity from its first saturation and sends on into the engines' queues until
  then (`run.FIRST_WARMUP_S`). Each run
  waits for the engines to be idle, warms up (and, in headcount-flow's main run,
  until `capped` has had a whole minute of the router's limits store full and that
  minute has ended, up to 135 s: a sliding minute starts with a minute's
  allowance, taken at once, and only after a full minute is the rate exactly the
  limit; the store's minutes are whole minutes of `time.monotonic()`, which every
  process shares), then measures a window of two parts (`sheddable`
  sends in the second), stops every sender at its end and waits `--drain` s for
  the requests still open. Requests are counted by when they were sent.
- Reported per target and tenant: sent, served (200 and the stream to
  `[DONE]`), refused by status, lost (no answer, a dropped connection, a stream
  cut: must be 0), TTFT p50/p90/p99 (first content chunk), goodput (served with
  TTFT within 1 s, per second), each batch tenant's share of the batch tenants'
  engine time (served requests: every one costs one service time) against its
  weight's, tokens per minute served (prompt + completion, the answers' `usage`)
  against `capped`'s limit, the engines' own queue (sampled every 0.5 s).
- Checked (the issue's "Done when"), per flooded target: interactive TTFT p90 at
  most the unloaded p90 plus one service time; batch shares within 10 % of the
  weights'; `capped` within 5 % of its `tokens_per_minute`; every `sheddable`
  request refused at once (429 within 0.1 s) while the fleet is saturated; 0
  lost over every run of the target (warm-ups and load points included).

Usage: `.venv/bin/python -m bench.overload [--full] [--targets a,b] [--points 1,2]
[--duration S] [--require-peers]`; `make bench-overload`. Quick (the default) is about
5 minutes on 2 cores; `--full` measures longer windows at more load points (~15 min).
Exit 0 when measured (missed checks are in the report), 1 if a headcount target could
not be measured, 2 on setup errors. The report is printed and written to
`bench/out/overload-<timestamp>.md`, the plot beside it and in `bench/overload-ttft-p90.png`.
"""
