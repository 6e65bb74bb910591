"""Loopback addresses for simulated pods: one IP per pod, one port shared by all.

A pod's engine URL is `http://<podIP>:<engine port>`, so simulated engines
listen on distinct loopback addresses (Linux routes all of 127.0.0.0/8 to
`lo`) and on the same port, as real pods do. The one place that picks free
ports, for tests, the demo and the benchmarks alike.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

__all__ = ["free_port", "free_port_on_all"]


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1", *, attempts: int = 100) -> int:
    """A TCP port on `host` that was free a moment ago and not handed out before in this process.

    The kernel may offer a port again as soon as its probe socket closes, so two
    ports asked for before either is bound (a router's and its metrics port)
    could otherwise be the same one.
    """
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind((host, 0))
            port: int = probe.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port on {host} that was not handed out before")


def free_port_on_all(addresses: Sequence[str], *, attempts: int = 50) -> int:
    """A TCP port that was free a moment ago on every one of `addresses`."""
    for _ in range(attempts):
        port = free_port(addresses[0])
        sockets: list[socket.socket] = []
        try:
            for address in addresses:
                sock = socket.socket()
                sockets.append(sock)
                sock.bind((address, port))
            return port
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no port free on all of {', '.join(addresses)}")
