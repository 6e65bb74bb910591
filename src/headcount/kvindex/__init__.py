"""Which engine holds which prompt prefix, from the engines' own KV events; never trusted if wrong.

One subscriber per engine (`subscriber.py`) reads vLLM's KV-event stream and
feeds that engine's index (`index.py`), keyed by the router's own chained
block hash (`keys.py`). The registry (`registry.py`) starts and stops both with
the engine, and keeps each index's trust (`trust.py`): synced, rebuilding,
stale or off. The `kv-aware` routing policy reads only usable indexes.
"""

__all__: list[str] = []
