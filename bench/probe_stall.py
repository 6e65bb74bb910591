"""How long a hostile engine's probe answers stall the router's event loop.

One engine serves a 100 MiB `/metrics` and a `/v1/models` listing 200,000 LoRA
adapters (vLLM's card shape, `permission` included); the router (the real
`headcount serve` process, probing every `--probe-interval`) probes it while a
client sends small requests to the router one after another (`GET /livez`, which
the router answers itself, so each latency is the router's own) and times them.
The worst latency is the worst event-loop stall the client met; the router's
peak RSS is read from /proc. Nothing is asserted: the figures are printed.

Run: `.venv/bin/python bench/probe_stall.py` (about 40 s; `--seconds`,
`--probe-interval`, `--metrics-mib`, `--adapters`, `--no-netns`, and any extra
router flags after `--`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time
from pathlib import Path

from _harness import (
    BenchError,
    Processes,
    enter_private_network,
    free_port,
    http_call,
    wait_until,
)

__all__: list[str] = []

OUT = Path(__file__).resolve().parent / "out"
_REQUEST = b"GET /livez HTTP/1.1\r\nHost: bench\r\n\r\n"


def _metrics_body(mib: int) -> bytes:
    """Plausible vLLM exposition text (histogram buckets), the gauges the router reads last."""
    lines = []
    for le in range(200):
        lines.append(
            f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}.0",'
            f'model_name="hostile"}} {le}\n'
        )
    block = "".join(lines).encode()
    body = block * max(1, (mib << 20) // len(block))
    return body + (
        b'vllm:num_requests_running{engine="0",model_name="hostile"} 1.0\n'
        b'vllm:num_requests_waiting{engine="0",model_name="hostile"} 2.0\n'
        b'vllm:kv_cache_usage_perc{engine="0",model_name="hostile"} 0.5\n'
    )


def _models_body(adapters: int) -> bytes:
    def card(name: str, parent: str | None) -> dict[str, object]:
        return {
            "id": name,
            "object": "model",
            "created": 1700000000,
            "owned_by": "vllm",
            "root": name if parent is None else f"/adapters/{name}",
            "parent": parent,
            "max_model_len": 4096,
            "permission": [
                {
                    "id": f"modelperm-{name}",
                    "object": "model_permission",
                    "created": 1700000000,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    cards = [card("hostile", None)] + [card(f"lora-{i}", "hostile") for i in range(adapters)]
    return json.dumps({"object": "list", "data": cards}).encode()


async def _serve_hostile(port: int, metrics_mib: int, adapters: int) -> None:
    answers = {
        b"/metrics": _metrics_body(metrics_mib),
        b"/v1/models": _models_body(adapters),
    }
    sizes = [len(answers[path]) >> 20 for path in (b"/metrics", b"/v1/models")]
    print(f"bodies: /metrics {sizes[0]} MiB, /v1/models {sizes[1]} MiB", flush=True)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                body = answers.get(path, b'{"error": "no"}')
                status = b"200 OK" if path in answers else b"404 Not Found"
                writer.write(
                    b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n" % (status, len(body))
                )
                writer.write(body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


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
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--probe-interval", default="2s")
    parser.add_argument("--metrics-mib", type=int, default=100)
    parser.add_argument("--adapters", type=int, default=200_000)
    parser.add_argument("--no-netns", action="store_true")
    parser.add_argument("--serve-hostile", type=int, help=argparse.SUPPRESS)
    parser.add_argument("router_flags", nargs="*")
    ns = parser.parse_args()
    if ns.serve_hostile:
        asyncio.run(_serve_hostile(ns.serve_hostile, ns.metrics_mib, ns.adapters))
        return 0
    if not ns.no_netns:
        enter_private_network()
    engine_port, router_port = free_port(), free_port()
    with Processes(OUT / f"probe-stall-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}") as procs:
        engine = procs.start(
            "hostile-engine",
            [
                *(sys.executable, __file__, "--serve-hostile", str(engine_port)),
                *(f"--metrics-mib={ns.metrics_mib}", f"--adapters={ns.adapters}"),
            ],
        )
        wait_until(
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
        wait_until(up, 30, "router", router)
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
