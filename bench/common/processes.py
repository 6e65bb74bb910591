"""The processes a benchmark starts: each in its own process group, dying with the harness.

`Processes` starts programs with their output in a log file and stops every one
of them on exit, whatever happened; `block_until` waits for one to be ready, with
a deadline, through `headcount.sim.cluster.wait_until`.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from bench.common.harness import BenchError
from headcount.sim.cluster import wait_until

__all__ = ["Proc", "Processes", "block_until", "die_with_parent"]

_PR_SET_PDEATHSIG = 1
_STOP_GRACE_S = 5.0
_POLL_S = 0.1


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def die_with_parent() -> None:
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

    @property
    def log_dir(self) -> Path:
        """Where each program's log goes (and what else a run writes beside them)."""
        return self._log_dir

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
                preexec_fn=die_with_parent,
            )
        proc = Proc(name, popen, log_path)
        self._running.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        if proc in self._running:
            self._running.remove(proc)
        proc.stop()


def block_until(
    condition: Callable[[], bool], timeout_s: float, what: str, proc: Proc | None = None
) -> None:
    """Poll `condition` until it holds, blocking (outside any event loop): a `BenchError` if
    `timeout_s` passes or `proc` exits first, with the end of its log."""

    def holds() -> bool:
        if proc is not None and not proc.alive():
            raise BenchError(
                f"{proc.name} exited ({proc.popen.returncode}) before {what}:\n{proc.log_tail()}"
            )
        return condition()

    try:
        asyncio.run(wait_until(holds, timeout=timeout_s, interval=_POLL_S, what=what))
    except TimeoutError:
        tail = f":\n{proc.log_tail()}" if proc is not None else ""
        raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}{tail}") from None
