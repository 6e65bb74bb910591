"""Measure routing quality: what each router's choices do to time to first token on a caching fleet.

Method (the numbers are only as good as this):

- Private network namespace, loopback only (as bench/overhead.py).
- Fleet: 4 `headcount sim-engine` processes with a prefix cache
  (`--kv-blocks 720`, block size 16: 11,520 tokens, about 5.6 of the 16 tenants'
  ~2,000-token system prompts, i.e. a quarter of them plus the room running
  requests need), prefill 4,000 uncached tokens/s shared first come first
  served, 20 ms per output token. That is an 8B model on an H100 (16,000 tok/s,
  10 ms/token) slowed 4x in prefill and 2x in decode, so the fleet saturates at
  request rates 2 shared cores can generate and serve without the CPU becoming
  the bottleneck. KV events are published with topic "" (vLLM's default; what
  vllm-router's kv_aware needs); the same engines serve every target. Each
  engine has its own loopback address (127.0.0.11 on) and all share one pair
  of KV-event ports, as pods do, so a router finds every publisher with one port.
- Workload (`workload.py`, seeded): 16 tenants, each a ~2,000-token system
  prompt; short unique questions; 30 % of requests continue a multi-turn chat
  whose history grows; 24 output tokens, streamed. Poisson arrivals, open loop
  (`loadgen.py`), at each rate of `--rates`; the generator's own lag (actual
  minus scheduled send) is reported as p99.
- Per target and rate: every engine's prefix cache is reset
  (`POST /sim/reset_prefix_cache` once they are idle), then `--warmup` requests'
  worth of traffic (not measured: the caches fill; counted in requests, not
  seconds, so every load starts the window about as warm), then `--duration` seconds measured.
  Requests still open `--drain` seconds after the last send count as failed.
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
- Reported: TTFT p50/p90/p99 (first content chunk), end-to-end p50/p90, output
  tokens/s over the measured window, cache hit rate from the engines' own
  `vllm:prefix_cache_hits_total / queries_total` deltas over the measured window,
  failed requests, router CPU (utime+stime of its process tree) per request sent,
  each engine's share of the measured requests, generator lag p99.

Usage: `.venv/bin/python -m bench.routing [--quick] [--rates 3,7,11] [--duration S]
[--warmup N] [--targets a,b] [--require-peers] [--fault restart|gap]`; `make bench-routing`.
With `--fault`, one engine's event stream breaks a third of the way into each measured
window and the report adds TTFT p90 over time and when it returned to its pre-fault level.
Exit 0 when measured, 1 if a headcount target could not be measured, 2 on setup errors. The
report is printed and written to `bench/out/routing-<timestamp>.md` with the plot
beside it and in `bench/routing-ttft-p90.png`.
"""
