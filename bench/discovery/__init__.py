"""Kubernetes discovery at scale: `python -m bench.discovery` (the method: __main__.py)."""
