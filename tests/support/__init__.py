"""What tests share, one copy of each; no test module imports another.

The simulated cluster, the router process and its client, and the one way to
wait (`wait_until`, a `TimeoutError` at its deadline) are the product's own
harness (`headcount.sim.cluster`, `headcount.sim.loopback`); what is here only
tests need. The names most tests use are importable from `tests.support`; the
rest from their module:

- `clock`: `FakeClock`, time that moves only when the test moves it.
- `builders`: `spec`, `engine` and `ready_fleet`, one builder of each.
- `raw_engine`: engines that say exact bytes, and a port that never accepts.
- `stepped_engine`: a simulated engine on stepped virtual time, streams stamped in it.
- `metric_families`: the metric families the README promises, with their labels.
- `kv_event_index`, `kv_fixtures`, `kv_view_double`: a simulated engine's KV
  events recorded and indexed, vLLM's own recorded events, an index view double.
- `paths`: where the repository is.
- `routed`, `kv_routed`: the proxy on loopback before simulated engines; routing kv-aware.
- `router`: a whole `Router` in this process, with key files.
- `key_files`: a key file rewritten as an operator should, a key in a request's head.
- `admission`: admission driven by hand: a fleet probed into its states, requests.
- `apiserver`: the API server emulator seen from a client: a bare pod, a refusal.
- `story`: the fleet's log lines (the `story` fixture is offered by tests/conftest.py).
- `redis`: a real redis-server on loopback, stopped and started at will (`redis_server`).
- `ext_proc`: a gateway's side of the endpoint-picker protocol, and `headcount serve` with it.
- `envoy`: a real Envoy from the venv on deploy/gateway/envoy.yaml, headcount its endpoint picker.
"""

from __future__ import annotations

from headcount.sim.cluster.polling import wait_until
from tests.support.builders import engine, ready_fleet, spec
from tests.support.clock import FakeClock
from tests.support.metric_families import (
    EXPORTED_METRICS,
    HISTOGRAMS,
    KV_METRIC_LABELS,
    METRIC_LABELS,
)
from tests.support.paths import REPO
from tests.support.raw_engine import (
    EngineConnection,
    RawEngine,
    Script,
    blackholed_listener,
    raw_engine,
)

__all__ = [
    "EXPORTED_METRICS",
    "HISTOGRAMS",
    "KV_METRIC_LABELS",
    "METRIC_LABELS",
    "REPO",
    "EngineConnection",
    "FakeClock",
    "RawEngine",
    "Script",
    "blackholed_listener",
    "engine",
    "raw_engine",
    "ready_fleet",
    "spec",
    "wait_until",
]
