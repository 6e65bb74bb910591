"""The micro-benchmarks: one figure each, a module each, run as `python -m bench.micro.<name>`.

- `probe_stall`: how long a hostile engine's probe answers stall the router's
  event loop (its engine: `programs/stall_engine.py`);
- `auth_check`: what an API key check adds to one request;
- `kv_route_cost`: the router's CPU for a kv-aware decision;
- `usage_tap`: what token accounting adds to one request (`proxy/usage.py`).
"""
