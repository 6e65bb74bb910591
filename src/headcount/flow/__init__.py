"""Flow control: what happens when demand exceeds the fleet.

Tenants (`auth/tenants.py`) carry a priority, a fair-share weight and limits.
`limits.py` is the contract of the stores that hold the per-tenant request and
token counters (in the process, or in Redis shared by every replica).
"""

__all__: list[str] = []
