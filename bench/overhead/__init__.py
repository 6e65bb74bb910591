"""Measure what headcount costs per request, beside direct access and the Rust peer routers.

Method (the numbers are only as good as this):

- The run re-executes itself in a private network namespace (`unshare --net`,
  loopback only): nothing leaves the machine, no port on the host can collide,
  and peers that fetch a tokenizer from a hub fail at once instead of hanging.
- Two engine simulators start once and serve every target, with a 1 µs token
  delay so each streamed chunk leaves in its own write (at 0 the simulator sends
  the whole stream at once, and a router would forward one read, not 20 chunks).
- Targets, each a small declarative entry in `TARGETS`: `direct` (no router: wrk's
  threads are pinned one per engine by lua/openai.lua, so each engine gets half
  the connections, the round-robin a router does, at no cost), `headcount`,
  `vllm-router` and `sglang-router`, all round-robin over the same two engines;
  `headcount-tenants` is headcount with a tenants file of one unlimited tenant whose
  key every request carries (flow control on, never saturated nor limited): beside
  `headcount`, what flow control costs per request on a fleet with room; beside
  `headcount-keys` (the same key in an `--api-keys-file`), what it costs over the key
  check alone. `envoy+picker` is headcount as the endpoint picker of a real Envoy
  (deploy/gateway/envoy.yaml, both body modes FULL_DUPLEX_STREAMED, as the example
  ships): wrk talks to Envoy, Envoy asks headcount over ext_proc and then connects to
  the engine it named; `envoy+picker-buffered` is the example's other pair (the request
  body BUFFERED, the response STREAMED, which headcount switches off when it needs
  nothing of it). Their router CPU is the headcount process's alone, beside headcount's
  own data plane; Envoy's CPU per request is reported apart.
- Workloads: chat non-streaming at 32 and 128 connections, streaming (20 chunks)
  at 32. wrk counts a streamed (chunked) response once, when its last chunk
  arrives, and its latency is the whole stream's.
- Per workload, every router is started fresh, checked (it lists both engines as
  ready where it can say; an answer is well-formed, a stream has 20 chunks) and
  warmed up once, then kept alive across rounds. Each round measures every
  target once, the order rotated by one per round, so drift on a noisy 2-core
  machine hits every target alike. Medians over rounds are reported.
- Router CPU per request = utime+stime of the router's process tree (all threads
  and child processes) over one wrk run / 2xx responses of that run. Non-2xx and
  socket errors are reported beside: a router answering 503s fast is not fast.
  So is how the engines split the work (from the simulator's `/sim/stats`).
- Everything shares the two cores (wrk, engines, router): throughput ratios show
  the router's cost relative to the engines'; CPU µs/request is the steadier number.

Usage: `.venv/bin/python -m bench.overhead [--quick] [--rounds N] [--duration S]
[--targets direct,headcount,headcount-keys,headcount-tenants,envoy+picker,
envoy+picker-buffered,vllm-router,sglang-router]
[--workloads chat-c32,...] [--baseline REV ...]`. `--baseline` measures headcount as it
was at a git revision in the same rounds as today's, for the before/after of a hot-path
change.
Peers and wrk: `bench/common/peers.sh` installs them (idempotent). The report is printed
and written to `bench/out/overhead-<timestamp>.md`, logs beside it.
"""
