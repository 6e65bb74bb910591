"""Flow control: what happens when demand exceeds the fleet.

Tenants (`auth/tenants.py`) carry a priority, a fair-share weight and limits.
`control.py` admits each request to an engine with room, queues it
(`queue.py`: priority bands, fair shares, arrival) or refuses it
(`ticket.py`); `limits.py` is the contract of the stores that hold the
per-minute request and token counters, in the process (`window.py`) or in
Redis shared by every replica (`redis_store.py` on `resp.py`).
"""

__all__: list[str] = []
