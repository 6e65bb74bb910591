"""headcount's benchmarks, one package per suite, run from the repository root.

`python -m bench.overhead`, `bench.discovery`, `bench.hostile`, `bench.soak`,
`bench.routing` and `bench.overload` are the suites; `python -m bench.micro.probe_stall`,
`bench.micro.auth_check` and `bench.micro.kv_route_cost` the micro-benchmarks.
`bench.common` is what they share (processes, ports, HTTP calls, /proc readings,
the peer routers); a suite's `programs/` are the modules it starts as processes of
their own, by `python -m`, so they import `bench` as the benchmark did. Reports go
to `bench/out/`. How to run each and what it measures: bench/README.md.
"""
