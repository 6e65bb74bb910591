"""Instructions the router executes per proxied request, counted by valgrind, not timed.

On these shared 2-core machines router CPU per request moves 10-20 % between runs
of the same code, so `python -m bench.overhead` cannot see a change of a few
percent. An instruction count can: the router runs under valgrind's cachegrind
(no cache simulation) with static discovery over two simulated engines, one
keep-alive client sends `--requests` chats (or 20-chunk streams) after a
warm-up, and the router's total is taken again for `--requests` / 3. The
difference divided by the extra requests is the cost of one request, start-up
and shutdown cancelled out. Probes are put an hour apart so that nothing else
runs meanwhile. Chat counts repeat within about 0.5 %; stream counts move a few
percent, as how the engine's chunks fall into reads depends on timing.

`--baseline REV` counts headcount at a git revision the same way (its `src/`
only; the engines and this script are today's). `--flow` counts, beside each
target, the two set-ups `bench.overhead` times (`FLOW_CONFIGS`): one key sent with
every request, in an `--api-keys-file`, then in a tenants file as one unlimited
tenant (flow control on: every request is metered, none waits or is refused).
Flow control's cost is the second less the first. Needs Debian's `valgrind`.

Usage: `.venv/bin/python -m bench.micro.instructions [--kind chat,stream]
[--requests 1200] [--baseline REV ...] [--flow]`.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import shutil
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.common.harness import OUT, BenchError, headcount_at, run_benchmark, say
from bench.common.processes import Proc, Processes, block_until
from bench.overhead.targets import TENANT_KEY, TENANTS_FILE
from headcount.sim.loopback import free_port

WARMUP = 50
_TOTAL = re.compile(r"I\s+refs:\s+([\d,]+)")
_LENGTH = re.compile(rb"content-length: (\d+)")


@dataclass(frozen=True)
class Config:
    """How a counted router is set up beyond `serve_flags`: its name's suffix, its files
    (written into the run's directory) and the key it is sent, if any."""

    suffix: str = ""
    files: tuple[tuple[str, str, str], ...] = ()
    """(flag, file name, text): `--flag=<directory>/<file name>` holding `text`."""
    key: str | None = None

    def flags(self, directory: Path) -> tuple[str, ...]:
        for _, name, text in self.files:
            (directory / name).write_text(text)
        return tuple(f"{flag}={directory / name}" for flag, name, _ in self.files)


PLAIN = Config()
FLOW_CONFIGS = (
    Config("+keys", (("--api-keys-file", "api-keys.txt", f"{TENANT_KEY}\n"),), TENANT_KEY),
    Config("+tenants", (("--tenants-file", "tenants.toml", TENANTS_FILE),), TENANT_KEY),
)
"""`bench.overhead`'s `headcount-keys` and `headcount-tenants`: the same key and files."""


def chat_request(stream: bool, key: str | None = None) -> bytes:
    body = json.dumps(
        {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 20,
            "stream": stream,
        }
    ).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
    if key is not None:
        head += b"Authorization: Bearer %s\r\n" % key.encode()
    return head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def exchange(client: socket.socket, request: bytes, pending: bytes) -> tuple[int, bytes]:
    """Send one request, read its whole answer; the status and what came after it."""
    client.sendall(request)
    while True:
        end = pending.find(b"\r\n\r\n")
        if end >= 0:
            head = pending[:end].lower()
            status = int(head.split(b" ", 2)[1])
            length = _LENGTH.search(head)
            if length is not None and len(pending) >= end + 4 + int(length.group(1)):
                return status, pending[end + 4 + int(length.group(1)) :]
            last = pending.find(b"\r\n0\r\n\r\n", end)
            if length is None and last >= 0:
                return status, pending[last + 7 :]
        data = client.recv(65536)
        if not data:
            raise BenchError("the router closed the connection")
        pending += data


def listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def answered(port: int, request: bytes) -> tuple[socket.socket, bytes] | None:
    """A connection on which the router just answered `request` with a 200, or None."""
    try:
        client = socket.create_connection(("127.0.0.1", port), timeout=60)
    except OSError:
        return None
    try:
        status, pending = exchange(client, request, b"")
    except (OSError, BenchError):
        client.close()
        return None
    if status != 200:
        client.close()
        return None
    return client, pending


def serve_flags(port: int, engines: list[str], extra: tuple[str, ...] = ()) -> list[str]:
    """`headcount serve`'s flags for a counted run: static discovery over `engines`, probes an
    hour apart so that nothing else runs meanwhile, warnings only."""
    return [
        "serve",
        "--host=127.0.0.1",
        f"--port={port}",
        "--discovery=static",
        f"--backends={','.join(engines)}",
        "--probe-interval=3600",
        "--log-level=warning",
        *extra,
    ]


def first_answer(
    port: int, request: bytes, router: Proc, timeout: float, what: str
) -> tuple[socket.socket, bytes]:
    """A keep-alive connection on which the router at `port` just answered `request` 200."""
    ready: list[tuple[socket.socket, bytes]] = []

    def answers() -> bool:
        connection = answered(port, request)
        if connection is not None:
            ready.append(connection)
        return bool(ready)

    block_until(answers, timeout, what, router)
    return ready[0]


def send(client: socket.socket, request: bytes, pending: bytes, times: int) -> bytes:
    """Send `request` `times` times, one after the other, each answered 200; what is left."""
    for _ in range(times):
        status, pending = exchange(client, request, pending)
        if status != 200:
            raise BenchError(f"the router answered {status}")
    return pending


TOKEN_DELAY_S = 0.002
"""Between two chunks of a stream: under valgrind the router is some 50 times slower, and
chunks written closer together reach it one, two or all in a read, as the run's timing
falls, which moved a stream's count by 10,000 instructions between runs. At 2 ms every
chunk is a read of its own, as an engine's tokens come to a router."""


def start_engines(procs: Processes) -> list[str]:
    """Two simulated engines, each chunk of a stream in its own write; their URLs."""
    urls = []
    for number in (1, 2):
        port = free_port()
        engine = [sys.executable, "-m", "headcount.sim.engine", "--host", "127.0.0.1"]
        engine += ["--port", str(port), "--model", "sim-model"]
        engine += ["--token-delay", str(TOKEN_DELAY_S)]
        started = procs.start(f"engine-{number}", engine, port=port)
        block_until(functools.partial(listens, port), 60, "an engine to listen", started)
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def under_valgrind(
    procs: Processes,
    name: str,
    tool: tuple[str, ...],
    program: tuple[str, ...],
    engines: list[str],
    requests: int,
    stream: bool,
    config: Config = PLAIN,
) -> Proc:
    """The router run under valgrind with `tool`'s flags, set up as `config`, through the
    warm-up and `requests` requests, then shut down so that valgrind writes what it counted;
    the stopped process."""
    port = free_port()
    extra = config.flags(OUT)
    command = ["valgrind", *tool, *program, *serve_flags(port, engines, extra)]
    router = procs.start(f"{name}-{requests}", command, port=port)
    request = chat_request(stream, config.key)
    client, pending = first_answer(
        port, request, router, 300, "the router under valgrind to answer 200"
    )
    with client:
        send(client, request, pending, WARMUP + requests)
    # SIGTERM alone, waited for: the router shuts down and valgrind writes its totals, which
    # takes longer than `Processes.stop` waits before its SIGKILL.
    router.popen.send_signal(signal.SIGTERM)
    router.popen.wait(timeout=300)
    procs.stop(router)
    return router


def count(
    procs: Processes,
    name: str,
    program: tuple[str, ...],
    engines: list[str],
    requests: int,
    stream: bool,
    config: Config = PLAIN,
) -> int:
    """The router's total instructions for a run that proxies `requests` requests."""
    tool = (
        "--tool=cachegrind",
        "--cache-sim=no",
        "--trace-children=yes",
        "--cachegrind-out-file=/dev/null",
    )
    router = under_valgrind(procs, name, tool, program, engines, requests, stream, config)
    report = router.log_path.read_text(errors="replace")
    total = _TOTAL.search(report)
    if total is None:
        raise BenchError(f"no instruction count from valgrind:\n{router.log_tail()}")
    return int(total.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.instructions")
    parser.add_argument("--kind", default="chat,stream", help="comma list of chat, stream")
    parser.add_argument("--requests", type=int, default=1200, help="requests in the long run")
    parser.add_argument("--baseline", action="append", default=[], metavar="REV")
    parser.add_argument("--flow", action="store_true", help="also with a tenants file")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise BenchError("valgrind not found: apt-get install valgrind")
    # One string hash seed for every run: dict and set layouts, and so their costs, alike.
    os.environ["PYTHONHASHSEED"] = "0"
    programs: list[tuple[str, tuple[str, ...]]] = [
        ("headcount", (sys.executable, "-m", "headcount.cli"))
    ]
    for rev in args.baseline:
        commit, program = headcount_at(rev, OUT)
        programs.append((f"headcount@{commit}", program))
    configs = (PLAIN, *FLOW_CONFIGS) if args.flow else (PLAIN,)
    targets = [
        (name + config.suffix, program, config) for name, program in programs for config in configs
    ]
    short = args.requests // 3
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    with Processes(OUT / f"instructions-{stamp}-logs") as procs:
        urls = start_engines(procs)
        print("| target | kind | instructions per request |\n|---|---|--:|")
        for kind in args.kind.split(","):
            for name, program, config in targets:
                say(f"{name} {kind}: {short} and {args.requests} requests under valgrind")
                runs = [
                    count(procs, f"{name}-{kind}", program, urls, size, kind == "stream", config)
                    for size in (short, args.requests)
                ]
                print(f"| {name} | {kind} | {(runs[1] - runs[0]) // (args.requests - short):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_benchmark(main))
