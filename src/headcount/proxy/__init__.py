"""The data plane: routes each inference request to an engine, streams the answer, fails over.

`Proxy` and `start_server` are its surface (`dataplane.py`); inside, one module
per concern: `admission` (which engine, or which error), `exchange` (one
request's attempts, failover and streaming), `headers` (what crosses between
client and engine), `errors` (the answers it gives itself).
"""

from headcount.proxy.dataplane import Proxy, start_server

__all__ = ["Proxy", "start_server"]
