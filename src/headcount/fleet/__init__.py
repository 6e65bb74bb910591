"""The fleet: the engines the router believes in, their state, and the story of every change.

`engine.py` holds the values (what an engine is and how loaded it is), `fleet.py`
their one owner and its immutable snapshots, `story.py` the log line of each
state change, `outliers.py` the pure ejection rules, `vllm_load.py` an engine's
load as vLLM's `/metrics` reports it.
"""

from headcount.fleet.engine import Engine, EngineLoad, EngineSpec, EngineState, ProbeResult
from headcount.fleet.fleet import Fleet, FleetChange, FleetListener, Snapshot

__all__ = [
    "Engine",
    "EngineLoad",
    "EngineSpec",
    "EngineState",
    "Fleet",
    "FleetChange",
    "FleetListener",
    "ProbeResult",
    "Snapshot",
]
