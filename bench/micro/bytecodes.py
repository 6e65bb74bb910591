"""Where a proxied request's Python work goes: bytecodes per request, by layer and function.

`instructions.py` says how much a request costs, exactly; this says where. The router
runs under a bytecode tracer (`programs/traced_router.py`: `sys.settrace` with opcode
events) with static discovery over two simulated engines; one keep-alive client sends
`--requests` chats (or 20-chunk streams) after a warm-up, counting on only meanwhile.
Each function's bytecodes and calls are divided by the requests, and the functions are
summed per layer of the request's path (`LAYERS`). Counts are exact and repeat from run
to run; work done in C (httptools' parse, the JSON scanner, socket calls, uvloop) is not
a bytecode and shows only in `instructions.py`'s totals. `--flow` counts the router as
`bench.overhead` times it with flow control and without: one key sent with every request,
in a tenants file and in an `--api-keys-file` (`instructions.FLOW_CONFIGS`), and prints
the difference per function.

Usage: `.venv/bin/python -m bench.micro.bytecodes [--kind chat,stream] [--requests 300]
[--flow] [--top 25]`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from bench.common.harness import OUT, BenchError, run_benchmark, say
from bench.common.processes import Processes
from bench.micro.instructions import (
    FLOW_CONFIGS,
    PLAIN,
    WARMUP,
    Config,
    chat_request,
    first_answer,
    send,
    serve_flags,
    start_engines,
)
from headcount.sim.loopback import free_port

__all__: list[str] = []

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("HTTP: parse, write, relay (`_http/`)", ("headcount/_http/",)),
    (
        "data plane: screen, headers, errors",
        (
            "headcount/proxy/dataplane",
            "headcount/proxy/headers",
            "headcount/proxy/errors",
            "headcount/proxy/fairqueue",
        ),
    ),
    (
        "admission: body, route",
        ("headcount/proxy/admission", "headcount/proxy/payload", "headcount/proxy/parsepool"),
    ),
    ("routing policy", ("headcount/routing/",)),
    ("exchange: attempt, answer, outcome", ("headcount/proxy/exchange", "headcount/proxy/stalls")),
    (
        "flow control and metering",
        (
            "headcount/flow/",
            "headcount/proxy/demand",
            "headcount/proxy/usage",
        ),
    ),
    (
        "metrics",
        ("headcount/surfaces/metrics", "headcount/surfaces/flow_metrics", "prometheus_client/"),
    ),
    ("access log", ("headcount/surfaces/access_log", "headcount/logs")),
    ("fleet and load", ("headcount/fleet/",)),
    ("asyncio (Python side)", ("asyncio/",)),
)
_OTHER = "other"


def layer_of(function: str) -> str:
    for layer, prefixes in LAYERS:
        if function.startswith(prefixes):
            return layer
    return _OTHER


def count(
    procs: Processes,
    name: str,
    engines: list[str],
    requests: int,
    stream: bool,
    config: Config = PLAIN,
) -> dict[str, dict[str, float]]:
    """Bytecodes and calls per request, per function, for one router run set up as `config`."""
    port = free_port()
    out = OUT / f"bytecodes-{name}-{os.getpid()}.json"
    program = [sys.executable, "-m", "bench.micro.programs.traced_router", str(out)]
    extra = config.flags(OUT)
    router = procs.start(name, [*program, *serve_flags(port, engines, extra)], port=port)
    request = chat_request(stream, config.key)
    client, pending = first_answer(port, request, router, 120, "the traced router to answer 200")
    with client:
        pending = send(client, request, pending, WARMUP)
        router.popen.send_signal(signal.SIGUSR1)
        send(client, request, pending, requests)
        router.popen.send_signal(signal.SIGUSR1)
    router.popen.send_signal(signal.SIGTERM)
    router.popen.wait(timeout=120)
    procs.stop(router)
    try:
        counts = json.loads(out.read_text())
    except (OSError, ValueError) as error:
        raise BenchError(
            f"no counts from the traced router ({error}):\n{router.log_tail()}"
        ) from error
    out.unlink()
    return {kind: {f: n / requests for f, n in by.items()} for kind, by in counts.items()}


def report(title: str, counts: Mapping[str, Mapping[str, float]], top: int) -> None:
    bytecodes, calls = counts["bytecodes"], counts["calls"]
    total = sum(bytecodes.values())
    layers: dict[str, list[float]] = {}
    for function, n in bytecodes.items():
        entry = layers.setdefault(layer_of(function), [0.0, 0.0])
        entry[0] += n
        entry[1] += calls.get(function, 0.0)
    python_calls = sum(calls.values())
    print(f"\n### {title}: {total:,.0f} bytecodes, {python_calls:,.0f} Python calls a request\n")
    print("| layer | bytecodes | share | calls |\n|---|--:|--:|--:|")
    for layer, (n, c) in sorted(layers.items(), key=lambda item: -item[1][0]):
        print(f"| {layer} | {n:,.0f} | {n / total:.0%} | {c:,.0f} |")
    print(f"\n| function (top {top}) | bytecodes | calls |\n|---|--:|--:|")
    for function, n in sorted(bytecodes.items(), key=lambda item: -item[1])[:top]:
        print(f"| `{function}` | {n:,.1f} | {calls.get(function, 0.0):,.1f} |")


def difference(
    base: Mapping[str, Mapping[str, float]], other: Mapping[str, Mapping[str, float]], top: int
) -> None:
    before, after = base["bytecodes"], other["bytecodes"]
    delta = {f: after.get(f, 0.0) - before.get(f, 0.0) for f in set(before) | set(after)}
    added = sum(delta.values())
    print(f"\n### With the tenants file, minus the keys file: {added:+,.0f} bytecodes a request\n")
    print("| function | bytecodes |\n|---|--:|")
    for function, n in sorted(delta.items(), key=lambda item: -abs(item[1]))[:top]:
        if abs(n) >= 0.5:
            print(f"| `{function}` | {n:+,.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.bytecodes")
    parser.add_argument("--kind", default="chat,stream", help="comma list of chat, stream")
    parser.add_argument("--requests", type=int, default=300, help="requests counted")
    parser.add_argument("--flow", action="store_true", help="also with a tenants file")
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    args = parser.parse_args()
    os.environ["PYTHONHASHSEED"] = "0"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    with Processes(Path(OUT / f"bytecodes-{stamp}-logs")) as procs:
        urls = start_engines(procs)
        for kind in args.kind.split(","):
            say(f"{kind}: {args.requests} requests under the bytecode tracer")
            plain = count(procs, f"{kind}", urls, args.requests, kind == "stream")
            report(f"headcount, {kind}", plain, args.top)
            if args.flow:
                keyed, metered = (
                    count(
                        procs, kind + config.suffix, urls, args.requests, kind == "stream", config
                    )
                    for config in FLOW_CONFIGS
                )
                difference(keyed, metered, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(run_benchmark(main))
