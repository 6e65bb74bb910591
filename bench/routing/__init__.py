"""Measure routing quality: what each router's choices do to time to first token on a caching fleet.

Method (the numbers are only as good as this):

- Private network namespace, loopback only (as bench/overhead.py).
- Fleet: 4 `headcount sim-engine` processes with a prefix cache
  (`--kv-blocks 720`, block size 16: 11,520 tokens each, 46,080 for the fleet),
  prefill 4,000 uncached tokens/s shared first come first served, 20 ms per
  output token. That is an 8B model on an H100 (16,000 tok/s, 10 ms/token)
  slowed 4x in prefill and 2x in decode, so the fleet saturates at request
  rates 2 shared cores can generate and serve without the CPU becoming the
  bottleneck. KV events are published with topic "" (vLLM's default; what
  vllm-router's kv_aware needs); the same engines serve every target. Each
  engine has its own loopback address (127.0.0.11 on) and all share one pair
  of KV-event ports, as pods do, so a router finds every publisher with one port.
- Workloads (`workload.py`, seeded; `--workloads`, default `fitting,pressure`):
  tenants each with a long system prompt, short unique questions, 30 % of
  requests continuing a multi-turn chat whose history grows, 24 output tokens,
  streamed. `fitting`: 30 tenants, Zipf 1.2 popularity, ~1,416-token prompts
  (42,480 tokens in all: they fit the fleet's cache); `pressure`: 60 tenants,
  Zipf 1.2, 1,904-word (~1,920-token) prompts, 2.5x the fleet's cache; both at
  16 req/s (the generator keeps up: its lag p99 stays in single-digit ms).
  `uniform`: the original 16 tenants drawn uniformly, ~2,000-token prompts, at
  3, 7 and 11 req/s (not in the default run: counted in requests, its low
  rates' windows are long, and it would make the run about 5 times longer).
  Poisson arrivals, open loop (`loadgen.py`); the generator's own lag (actual
  minus scheduled send) is reported as p99, with a warning above 50 ms.
- Per target, workload, rate and seed (`--seeds`, default 3: the workload's
  seed and the next ones, each its own prompts and arrivals): every engine's
  prefix cache is reset (`POST /sim/reset_prefix_cache` once they are idle),
  then `--warmup` requests (default 200, not measured: the caches fill), then
  `--requests` measured ones (default 400, so a cell holds ~1,200 measured
  requests over 3 seeds). Requests still open `--drain` seconds after the last
  send count as failed.
- Targets: headcount `round-robin`, `least-loaded`, `prefix`, `kv-aware`
  (`--tokenizer builtin`, the simulator's, and the engines' KV events) and
  `kv-aware /tokenize` (no tokenizer: each request's ids from an engine's
  `POST /tokenize`); `envoy+headcount kv-aware`, the same kv-aware headcount as the
  endpoint picker of a real Envoy (deploy/gateway/envoy.yaml; clients talk to Envoy,
  its router CPU is headcount's alone); vllm-router
  `cache_aware`, `kv_aware` (static `--kv-event-source`/`--kv-event-replay-source`
  per engine, `--kv-event-model`), `round_robin`; sglang-router `cache_aware`,
  `round_robin`; and `oracle` (`programs/oracle.py`): asks every engine's
  `POST /sim/kv-cache/predict` per request and picks the lowest predicted TTFT.
  Peers with default settings otherwise.
- Reported per cell (workload, target, rate): the mean over seeds ± the 95 %
  confidence interval (Student's t on the per-seed values, `intervals.py`) of
  the cache hit rate (the engines' own `vllm:prefix_cache_hits_total /
  queries_total` deltas over the measured window) and TTFT mean, p90 and p99
  (first content chunk); end-to-end p90, failed requests, router CPU
  (utime+stime of its process tree) per request sent, each engine's share of
  the measured requests per seed, generator lag p99; each run's own row too.
- Offline, per run (`trace.py`, `cache_model.py`, `bounds.py`): the trace of
  which engine answered each request and what it found cached comes from the
  answers themselves (`system_fingerprint` is the sim-engine's name, usage's
  `cached_tokens`), which every router relays. The run's requests, their
  blocks computed as the engine computes them, are replayed through a model
  of the fleet's caches (LRU per engine, exactly the simulator's when requests
  run one at a time); the report gives the model's hit rate beside the
  engines' for every router's own routing, then (a) the pooled bound: one
  cache of the fleet's blocks with Belady's eviction over the same arrivals
  (and, for reference, the same cache under LRU), (b) the best fixed
  assignment of tenants to 1-2 home engines in hindsight, each engine's load
  within ±10 % of the mean, by seeded local search (`assignment.py`), and (c)
  each router's misses split into compulsory, capacity and routing misses
  (`misses.py` defines them).

Usage: `.venv/bin/python -m bench.routing [--quick] [--workloads fitting,pressure,uniform]
[--rates R,..] [--seeds N] [--warmup N] [--requests N] [--targets a,b] [--require-peers]
[--fault restart|gap]`; `make bench-routing` (the default run: 2 workloads x 12 targets x 3
seeds, about an hour). `--quick`: pressure only, one seed, 120 + 240 requests per target.
With `--fault`, one engine's event stream breaks a third of the way into each measured
window and the report adds TTFT p90 over time and when it returned to its pre-fault level.
Exit 0 when measured, 1 if a headcount target could not be measured, 2 on setup errors. The
report is printed and written to `bench/out/routing-<timestamp>.md` with the plot
beside it and in `bench/routing-ttft-p90.png`.
"""
