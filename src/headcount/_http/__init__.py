"""The data plane's own HTTP/1.1: a callback-driven server and an upstream keep-alive pool.

Private to headcount: `headcount.proxy` is its only user. The server
(`server.py`) parses client requests with httptools and answers them in order;
the upstream side (`upstream.py`) keeps keep-alive connections per engine and
reports each upstream read as one event. Foreign exceptions become the tree in
`errors.py`. No framework sits on this path: one costs several times the CPU per
request (bench/RESULTS.md).
"""

__all__: list[str] = []
