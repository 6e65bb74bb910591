"""Plumbing for the benchmarks in bench/ that makes a run bounded and leak-free.

A private network namespace (nothing leaves loopback), subprocesses in their own
process groups that die with the harness, free ports, readiness polled with a
deadline, CPU time read from /proc for a whole process tree, a process's memory and
open fds, and wrk driven through `lua/openai.lua`, whose summary line is parsed here.
Linux only.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

import headcount
from headcount.sim import loopback
from headcount.sim.cluster import PYTHON_CLI

__all__ = [
    "CLK_TCK",
    "WRK_SCRIPT",
    "BenchError",
    "HttpAnswer",
    "Proc",
    "Processes",
    "WrkResult",
    "enter_private_network",
    "free_port",
    "headcount_at",
    "http_call",
    "router_program",
    "rss_and_fds",
    "run_benchmark",
    "run_wrk",
    "tree_cpu_seconds",
    "wait_until",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
WRK_SCRIPT = Path(__file__).resolve().parent / "lua" / "openai.lua"

_NETNS_MARK = "HEADCOUNT_BENCH_NETNS"
_PR_SET_PDEATHSIG = 1
_STOP_GRACE_S = 5.0
_WRK_LINE = re.compile(r"^HC_WRK (\{.*\})$", re.MULTILINE)
_handed_out_ports: set[int] = set()


class BenchError(Exception):
    """The benchmark cannot go on: a tool is missing, a process died, a wait ran out."""


def enter_private_network() -> None:
    """Re-execute the running script inside a new network namespace with loopback up.

    Nothing the benchmark starts can reach the outside (peer routers that fetch a
    tokenizer fail at once instead of hanging) nor collide with ports in use on
    the host. Root gets `unshare --net`; anyone else a user namespace as well.
    """
    if os.environ.get(_NETNS_MARK) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
        return
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        raise BenchError("need `unshare` (util-linux) and `ip` (iproute2), or pass --no-netns")
    unshare = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "-r", "--net"]
    os.environ[_NETNS_MARK] = "1"
    os.execvp(unshare[0], [*unshare, "--", sys.executable, *sys.argv])


def headcount_at(rev: str, out_dir: Path) -> tuple[str, tuple[str, ...]]:
    """headcount as it was at git revision `rev`: its short commit and the program that runs it.

    Its `src/` is extracted with `git archive` under `out_dir` (once per commit) and run by
    this interpreter with that tree first on `PYTHONPATH` (the dependencies are today's).
    """
    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", f"{rev}^{{commit}}"],
            cwd=repo,
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
            ["git", "archive", commit, "src"], cwd=repo, check=True, capture_output=True
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


def free_port() -> int:
    """A loopback TCP port free right now and never handed out before in this run."""
    for _ in range(100):
        port = loopback.free_port()
        if port not in _handed_out_ports:
            _handed_out_ports.add(port)
            return port
    raise BenchError("no free loopback port found")


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel kills it if the harness dies first."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Proc:
    """One started program: its own process group, its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the whole group, then SIGKILL it if it is still there after a grace period."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; members of its group may linger: kill them too.
            with suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            return
        raise BenchError(f"{self.name} (pid {self.pid}) survived SIGKILL")


class Processes:
    """Starts programs and stops every one of them on exit, whatever happened.

    >>> with Processes(log_dir) as procs:
    ...     engine = procs.start("engine-1", ["python", "-m", "..."], port=8001)
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._running: list[Proc] = []

    def __enter__(self) -> Processes:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for proc in reversed(list(self._running)):
            try:
                self.stop(proc)
            except BenchError as error:
                print(f"warning: {error}", file=sys.stderr)

    def start(self, name: str, argv: list[str], port: int | None = None) -> Proc:
        """Start `argv` with output to `<log_dir>/<name>.log`; `port` must be free first."""
        if port is not None and not _port_is_free(port):
            raise BenchError(f"{name}: port {port} is already in use")
        if shutil.which(argv[0]) is None:
            raise BenchError(f"{name}: {argv[0]} not found")
        log_path = self._log_dir / f"{name}.log"
        with log_path.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        proc = Proc(name, popen, log_path)
        self._running.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        if proc in self._running:
            self._running.remove(proc)
        proc.stop()


def wait_until(
    condition: Callable[[], bool], timeout_s: float, what: str, proc: Proc | None = None
) -> None:
    """Poll `condition` until it holds; fail if `timeout_s` passes or `proc` exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and not proc.alive():
            raise BenchError(
                f"{proc.name} exited ({proc.popen.returncode}) before {what}:\n{proc.log_tail()}"
            )
        if condition():
            return
        if time.monotonic() > deadline:
            tail = f":\n{proc.log_tail()}" if proc is not None else ""
            raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}{tail}")
        time.sleep(0.1)


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def http_call(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    timeout_s: float = 5.0,
    host: str = "127.0.0.1",
) -> HttpAnswer | None:
    """One request to `host`:`port`, whole body read (chunked decoded); None if unreachable."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return HttpAnswer(response.status, response.read())
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _stat_fields(pid: str) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (after the command name, which may hold spaces)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rpartition(")")[2].split()


def _descendants(root: int) -> Iterator[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(entry)) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    stack = [root]
    while stack:
        pid = stack.pop()
        yield pid
        stack.extend(children.get(pid, ()))


def rss_and_fds(pid: int) -> tuple[float, int] | None:
    """Resident memory (VmRSS, MiB) and open file descriptors of `pid`; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024, fds
    return None


def tree_cpu_seconds(root: int) -> float:
    """CPU time (user + system, all threads) used so far by `root` and its live descendants.

    Reaped children count through their parent's cutime/cstime; a child that exited
    without being waited for between two readings is lost (none of ours do that).
    """
    ticks = 0
    for pid in _descendants(root):
        fields = _stat_fields(str(pid))
        if fields is not None:
            # utime, stime, cutime, cstime are fields 14-17 of proc(5); fields[0] is field 3.
            ticks += sum(int(value) for value in fields[11:15])
    return ticks / CLK_TCK


@dataclass(frozen=True)
class WrkResult:
    """What one wrk run saw: completed responses, failures, latency percentiles."""

    duration_s: float
    requests: int
    """Complete responses, any status; a streamed response counts once, at its last chunk."""
    non_2xx: int
    """Responses with a status above 399 (wrk's `errors.status`)."""
    socket_errors: int
    """Connect, read and write errors and timeouts."""
    p50_ms: float
    p99_ms: float

    @property
    def ok_requests(self) -> int:
        return self.requests - self.non_2xx

    @property
    def ok_per_s(self) -> float:
        return self.ok_requests / self.duration_s


def run_wrk(
    url: str,
    body_file: Path,
    connections: int,
    threads: int,
    duration_s: int,
    split_addrs: list[str] | None = None,
) -> WrkResult:
    """Run wrk against `url` POSTing `body_file`; with `split_addrs`, thread i goes to addr i."""
    env = dict(os.environ, HC_BODY_FILE=str(body_file), HC_SPLIT_ADDRS=",".join(split_addrs or []))
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration_s}s",
        "--timeout",
        "10s",
        "-s",
        str(WRK_SCRIPT),
        url,
    ]
    try:
        done = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=duration_s + 30,
            preexec_fn=_die_with_parent,
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"wrk did not finish within {duration_s + 30} s") from exc
    match = _WRK_LINE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise BenchError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    summary = json.loads(match.group(1))
    return WrkResult(
        duration_s=summary["duration_us"] / 1e6,
        requests=summary["requests"],
        non_2xx=summary["status"],
        socket_errors=sum(summary[kind] for kind in ("connect", "read", "write", "timeout")),
        p50_ms=summary["p50_us"] / 1e3,
        p99_ms=summary["p99_us"] / 1e3,
    )


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
