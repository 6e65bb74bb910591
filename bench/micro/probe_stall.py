"""How long a hostile engine's probe answers stall the router's event loop.

One engine (`programs/stall_engine.py`) serves a 100 MiB `/metrics` and a
`/v1/models` listing 200,000 LoRA adapters (vLLM's card shape, `permission`
included); the router (the real `headcount serve` process, probing every
`--probe-interval`) probes it while a client sends small requests to the router
one after another (`GET /livez`, which the router answers itself, so each latency
is the router's own) and times them.
The worst latency is the worst event-loop stall the client met; the router's
peak RSS is read from /proc. Nothing is asserted: the figures are printed.

Run: `.venv/bin/python -m bench.micro.probe_stall` (about 40 s; `--seconds`,
`--probe-interval`, `--metrics-mib`, `--adapters`, `--no-netns`, and any extra
router flags after `--`).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time

from bench.common.harness import OUT, BenchError, enter_private_network
from bench.common.httpcall import http_call
from bench.common.processes import Processes, block_until
from bench.common.procfs import status_kib
from headcount.sim.loopback import free_port

__all__: list[str] = []

STALL_ENGINE = "bench.micro.programs.stall_engine"
_REQUEST = b"GET /livez HTTP/1.1\r\nHost: bench\r\n\r\n"


def _time_requests(port: int, seconds: float) -> list[float]:
    """Latencies (s) of back-to-back `GET /livez` on one keep-alive connection."""
    latencies: list[float] = []
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and len(latencies) < 2_000_000:
            started = time.perf_counter()
            sock.sendall(_REQUEST)
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise BenchError("router closed the connection")
                answer += chunk
                if b"content-length:" in answer.lower():
                    head, _, body = answer.partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    if len(body) >= length:
                        break
            latencies.append(time.perf_counter() - started)
            time.sleep(0.002)
    finally:
        sock.close()
    return latencies


def _rss_mib(pid: int) -> float:
    peak_kib = status_kib("VmHWM", pid)
    return float("nan") if peak_kib is None else peak_kib / 1024


def _engine_view(port: int) -> str:
    answer = http_call(port, "GET", "/engines")
    if answer is None:
        return "?"
    engine = json.loads(answer.body)["engines"][0]
    return (
        f"state={engine['state']} adapters={len(engine['adapters'])} "
        f"running={engine['running']} last_error={engine['last_error']!r}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro.probe_stall", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--probe-interval", default="2s")
    parser.add_argument("--metrics-mib", type=int, default=100)
    parser.add_argument("--adapters", type=int, default=200_000)
    parser.add_argument("--no-netns", action="store_true")
    parser.add_argument("router_flags", nargs="*")
    ns = parser.parse_args()
    if not ns.no_netns:
        enter_private_network()
    engine_port, router_port = free_port(), free_port()
    with Processes(OUT / f"probe-stall-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}") as procs:
        engine = procs.start(
            "hostile-engine",
            [
                *(sys.executable, "-m", STALL_ENGINE, "--port", str(engine_port)),
                *(f"--metrics-mib={ns.metrics_mib}", f"--adapters={ns.adapters}"),
            ],
        )
        block_until(
            lambda: http_call(engine_port, "GET", "/nothing") is not None, 120, "engine", engine
        )
        router = procs.start(
            "router",
            [
                *(sys.executable, "-m", "headcount.cli", "serve", "--host", "127.0.0.1"),
                *("--port", str(router_port), "--backends", f"http://127.0.0.1:{engine_port}"),
                *("--probe-interval", ns.probe_interval, "--probe-timeout", "10s"),
                *ns.router_flags,
            ],
        )
        up = lambda: http_call(router_port, "GET", "/livez") is not None  # noqa: E731
        block_until(up, 30, "router", router)
        latencies = _time_requests(router_port, ns.seconds)
        print(f"engine as the router sees it: {_engine_view(router_port)}")
        print(f"router peak RSS: {_rss_mib(router.pid):.0f} MiB")
    ordered = sorted(latencies)
    print(
        f"GET /livez while probing: {len(ordered)} requests, "
        f"median {statistics.median(ordered) * 1e3:.2f} ms, "
        f"p99 {ordered[int(len(ordered) * 0.99)] * 1e3:.2f} ms, worst {ordered[-1] * 1e3:.1f} ms; "
        f"over 20 ms: {sum(1 for x in ordered if x > 0.02)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
