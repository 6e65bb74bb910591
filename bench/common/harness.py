"""The frame of a benchmark run: bounded, leak-free, and alone on its network.

A private network namespace (nothing leaves loopback), a `main` that stops every
started process however the run ends, where reports go, and which `headcount` a
suite measures: this interpreter's, or the tree of another git revision
(`--baseline REV`). Linux only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import headcount
from headcount.sim.cluster import PYTHON_CLI

__all__ = [
    "BENCH",
    "HEADCOUNT_BIN",
    "OUT",
    "BenchError",
    "add_run_arguments",
    "enter_private_network",
    "headcount_at",
    "router_program",
    "run_benchmark",
    "say",
]

BENCH = Path(__file__).resolve().parent.parent
REPO = BENCH.parent
OUT = BENCH / "out"
"""Every suite's reports and logs (git-ignored)."""
HEADCOUNT_BIN = Path(sys.executable).parent / "headcount"
"""The `headcount` console script beside this interpreter."""

_NETNS_MARK = "HEADCOUNT_BENCH_NETNS"


class BenchError(Exception):
    """The benchmark cannot go on: a tool is missing, a process died, a wait ran out."""


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """`--out` (the report directory) and `--no-netns`, which every run of the router takes."""
    parser.add_argument("--out", type=Path, default=OUT, help="report directory")
    parser.add_argument(
        "--no-netns", action="store_true", help="stay in the host's network namespace"
    )


def say(line: str) -> None:
    """Progress and warnings: to stderr, at once, apart from the report on stdout."""
    print(line, file=sys.stderr, flush=True)


def enter_private_network() -> None:
    """Re-execute the running benchmark inside a new network namespace with loopback up.

    Nothing the benchmark starts can reach the outside (peer routers that fetch a
    tokenizer fail at once instead of hanging) nor collide with ports in use on
    the host. Root gets `unshare --net`; anyone else a user namespace as well. The
    command line is the interpreter's own (`sys.orig_argv`), so `python -m bench.x`
    runs again as a module, from the same working directory.
    """
    if os.environ.get(_NETNS_MARK) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
        return
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        raise BenchError("need `unshare` (util-linux) and `ip` (iproute2), or pass --no-netns")
    unshare = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "-r", "--net"]
    os.environ[_NETNS_MARK] = "1"
    os.execvp(unshare[0], [*unshare, "--", sys.executable, *sys.orig_argv[1:]])


def headcount_at(rev: str, out_dir: Path) -> tuple[str, tuple[str, ...]]:
    """headcount as it was at git revision `rev`: its short commit and the program that runs it.

    Its `src/` is extracted with `git archive` under `out_dir` (once per commit) and run by
    this interpreter with that tree first on `PYTHONPATH` (the dependencies are today's);
    the benchmark around it is this tree's.
    """
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", f"{rev}^{{commit}}"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except subprocess.CalledProcessError as exc:
        raise BenchError(f"--baseline {rev}: {exc.stderr.strip()}") from None
    tree = out_dir / f"baseline-{commit}"
    if not (tree / "src" / "headcount").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", commit, "src"], cwd=REPO, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return commit, ("env", f"PYTHONPATH={tree / 'src'}", sys.executable, "-m", "headcount.cli")


def router_program(baseline: str | None, out_dir: Path) -> tuple[tuple[str, ...], str]:
    """How to run `headcount`, and which one it is: this interpreter's (its tree and git
    revision), or, with `baseline`, the tree of that git revision (`headcount_at`)."""
    if baseline:
        commit, program = headcount_at(baseline, out_dir)
        return program, f"revision {commit} (`--baseline {baseline}`)"
    tree = Path(headcount.__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(tree), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        rev = ""
    return PYTHON_CLI, f"{tree} ({rev or 'not a git tree'})"


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run_benchmark(body: Callable[[], int], no_netns: bool = False) -> int:
    """A benchmark's `main`: `body()` in a private network namespace (unless `no_netns`),
    every started process stopped however it ends. A `BenchError` exits 2, an interrupt 130.
    """
    # Explicit, so a run started in the background (SIGINT ignored) still cleans up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    try:
        if not no_netns:
            enter_private_network()
        return body()
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("interrupted: every started process was stopped", file=sys.stderr, flush=True)
        return 130
