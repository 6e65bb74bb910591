"""The data plane: routes each inference request to an engine, streams the answer, fails over.

`Proxy`, `start_server` and `start_local_server` (the admin port) are its
surface (`dataplane.py`); inside, one module per concern: `admission` (which
engine, which error, or what to await first), `exchange` (one request's
attempts, failover and streaming), `headers` (what crosses between client and
engine), `errors` (the answers it gives itself).
"""

from headcount.proxy.dataplane import Proxy, start_local_server, start_server

__all__ = ["Proxy", "start_local_server", "start_server"]
