"""What /proc says of a process: CPU time of its whole tree, resident memory, open fds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CLK_TCK", "rss_and_fds", "status_kib", "tree_cpu_seconds"]

CLK_TCK = os.sysconf("SC_CLK_TCK")


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


def status_kib(field: str, pid: int | str = "self") -> int | None:
    """A kB line of /proc/<pid>/status (`VmRSS`, `VmHWM`); None once the process is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def rss_and_fds(pid: int) -> tuple[float, int] | None:
    """Resident memory (VmRSS, MiB) and open file descriptors of `pid`; None once it is gone."""
    rss_kib = status_kib("VmRSS", pid)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return None if rss_kib is None else (rss_kib / 1024, fds)


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
