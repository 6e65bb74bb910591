"""Where a proxied request's instructions go, by library and by compiled module (callgrind).

`bytecodes.py` traces the Python the router interprets; once mypyc compiles the data
plane there are few bytecodes left to trace, and the work is C: the compiled modules,
CPython's runtime under them (objects, dicts, bytes, calls), uvloop, httptools, libc.
This runs the router under valgrind's callgrind with static discovery over two simulated
engines, one keep-alive client sending chats (or 20-chunk streams), twice: `--requests`
/ 3 and `--requests` after the same warm-up. Each function's exclusive instructions in
the long run minus the short one, over the extra requests, is its cost per request,
start-up and shutdown cancelled out (as `instructions.py` counts totals). Functions are
summed by the shared object they live in, and the compiled data plane's by module (mypyc
names a module's C functions after it). Kernel work (the syscalls) is not counted.

`--flow` profiles the router as `bench.overhead` times it with flow control, one key sent
with every request, in an `--api-keys-file` and then in a tenants file
(`instructions.FLOW_CONFIGS`), and lists what the tenants file adds per function.

Usage: `.venv/bin/python -m bench.micro.native_profile [--kind chat,stream]
[--requests 600] [--top 15] [--flow]`. It profiles the router as `src/` holds it: compiled where
`make install` built it, else the Python sources. Needs Debian's `valgrind`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from bench.common.harness import OUT, BenchError, run_benchmark, say
from bench.common.processes import Processes
from bench.micro.instructions import FLOW_CONFIGS, PLAIN, Config, start_engines, under_valgrind
from headcount.compiled import data_plane

__all__: list[str] = []

_NAMED = re.compile(r"^\((\d+)\)(?: (.*))?$")
_MYPYC = re.compile(r"^CPy(?:Def|Py)_(?:_?http___|proxy___|flow___)?([a-z_]+?)___")
_LIBRARIES = (
    ("headcount__mypyc", "compiled data plane (mypyc)"),
    ("libpython", "CPython: interpreter and runtime"),
    ("/bin/python", "CPython: interpreter and runtime"),
    ("/uvloop/", "uvloop: event loop, sockets"),
    ("/httptools/", "httptools: HTTP parsing"),
    ("/libc.so", "libc: memory, copies"),
    ("/ld-linux", "libc: memory, copies"),
    ("/_json.", "JSON (CPython's scanner)"),
)
"""Parts of the shared object's path that say what it is (uvloop's is `loop.*.so`)."""


def _library(path: str) -> str:
    return next((label for part, label in _LIBRARIES if part in path), f"other: {Path(path).name}")


def exclusive(path: Path) -> Counter[tuple[str, str]]:
    """Exclusive instructions per (shared object, function) from one callgrind output file.

    The format names objects and functions once, `(id) name`, and by `(id)` after; a cost
    line after `calls=` is the callee's inclusive cost, charged to the call, not the caller.
    """
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    costs: Counter[tuple[str, str]] = Counter()
    obj = fn = ""
    after_call = False
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("ob", "fn", "cob", "cfn"):
            kind = key.removeprefix("c")
            named = _NAMED.match(value)
            if named is not None:
                ident, name = named.groups()
                if name is not None:
                    names[kind][ident] = name
                value = names[kind].get(ident, ident)
            if key == "ob":
                obj = value
            elif key == "fn":
                fn = value
            continue
        if sep and key == "calls":
            after_call = True
            continue
        if not line or not (line[0].isdigit() or line[0] in "+-*"):
            continue
        fields = line.split()
        if len(fields) >= 2 and not after_call:
            costs[obj, fn] += int(fields[1])
        after_call = False
    return costs


@dataclass(frozen=True)
class Setup:
    """What every profiled run of one kind shares: where it logs, what it routes to and sends."""

    procs: Processes
    logs: Path
    engines: list[str]
    stream: bool
    config: Config = PLAIN


def profile(setup: Setup, name: str, requests: int) -> Counter[tuple[str, str]]:
    """Exclusive instructions per (object, function) of a run proxying `requests` requests."""
    out = setup.logs / f"callgrind-{name}-{requests}.out"
    tool = ("--tool=callgrind", f"--callgrind-out-file={out}")
    program = (sys.executable, "-m", "headcount.cli")
    router = under_valgrind(
        setup.procs, name, tool, program, setup.engines, requests, setup.stream, setup.config
    )
    if not out.exists():
        raise BenchError(f"callgrind wrote no profile:\n{router.log_tail()}")
    return exclusive(out)


def report(title: str, per_request: dict[tuple[str, str], float], top: int) -> None:
    total = sum(per_request.values())
    libraries: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    for (obj, fn), cost in per_request.items():
        library = _library(obj)
        libraries[library] += int(cost)
        if "mypyc" in library:
            matched = _MYPYC.match(fn)
            modules[matched.group(1) if matched else "(mypyc runtime)"] += int(cost)
    print(f"\n{title}: {total:,.0f} instructions a request\n")
    print("| where | instructions | share |\n|---|--:|--:|")
    for library, cost in libraries.most_common():
        print(f"| {library} | {cost:,} | {cost / total:.0%} |")
    if modules:
        print("\n| compiled module | instructions | share of all |\n|---|--:|--:|")
        for module, cost in modules.most_common(top):
            print(f"| {module} | {cost:,} | {cost / total:.1%} |")
    print("\n| function | where | instructions |\n|---|---|--:|")
    ranked = sorted(per_request.items(), key=lambda item: -item[1])[:top]
    for (obj, fn), cost in ranked:
        print(f"| `{fn[:70]}` | {_library(obj)} | {cost:,.0f} |")


def per_request(setup: Setup, name: str, requests: int) -> dict[tuple[str, str], float]:
    """Each function's exclusive instructions per request: a long run less a short one."""
    short = requests // 3
    runs = [profile(setup, name, size) for size in (short, requests)]
    return {
        key: (runs[1][key] - runs[0].get(key, 0)) / (requests - short)
        for key in runs[1]
        if runs[1][key] > runs[0].get(key, 0)
    }


def difference(
    title: str, plain: dict[tuple[str, str], float], metered: dict[tuple[str, str], float], top: int
) -> None:
    """What `metered` adds to `plain`, per function."""
    keys = set(plain) | set(metered)
    added = {key: metered.get(key, 0.0) - plain.get(key, 0.0) for key in keys}
    print(f"\n{title}: {sum(added.values()):+,.0f} instructions a request\n")
    print("| function | where | instructions |\n|---|---|--:|")
    for (obj, fn), cost in sorted(added.items(), key=lambda item: -abs(item[1]))[:top]:
        print(f"| `{fn[:70]}` | {_library(obj)} | {cost:+,.0f} |")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.native_profile")
    parser.add_argument("--kind", default="chat,stream", help="comma list of chat, stream")
    parser.add_argument("--requests", type=int, default=600, help="requests in the long run")
    parser.add_argument("--top", type=int, default=15, help="modules and functions listed")
    parser.add_argument("--flow", action="store_true", help="also with a tenants file")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise BenchError("valgrind not found: apt-get install valgrind")
    os.environ["PYTHONHASHSEED"] = "0"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    logs = OUT / f"native-profile-{stamp}-logs"
    with Processes(logs) as procs:
        urls = start_engines(procs)
        for kind in args.kind.split(","):
            say(f"{kind}: {args.requests // 3} and {args.requests} requests under callgrind")
            setup = Setup(procs, logs, urls, stream=kind == "stream")
            plain = per_request(setup, kind, args.requests)
            report(f"headcount ({data_plane()} data plane), {kind}", plain, args.top)
            if args.flow:
                keyed, tenants = (
                    per_request(
                        replace(setup, config=config), f"{kind}{config.suffix}", args.requests
                    )
                    for config in FLOW_CONFIGS
                )
                difference("with a key, in a keys file", plain, keyed, args.top)
                difference(
                    "the same key in a tenants file, less in a keys file", keyed, tenants, args.top
                )
    return 0


if __name__ == "__main__":
    sys.exit(run_benchmark(main))
