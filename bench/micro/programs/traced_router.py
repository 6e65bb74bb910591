"""headcount's router with every Python bytecode it runs counted, per function.

`python -m bench.micro.programs.traced_router OUT.json serve ...` runs `headcount serve ...`
under `sys.settrace` with opcode events. Counting is off until the first SIGUSR1 and
toggles at each one, so that start-up and warm-up stay out; at exit the counts (bytecodes
and calls per `file:qualname`) are written to OUT.json. Tracing makes the router tens of
times slower: only the counts mean anything, never its timings.
"""

from __future__ import annotations

import json
import runpy
import signal
import sys
from collections import Counter
from types import FrameType
from typing import Any

__all__: list[str] = []

_counting = False
_bytecodes: Counter[str] = Counter()
_calls: Counter[str] = Counter()


def _name(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    for marker in ("/site-packages/", "/src/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{code.co_qualname}"


def _trace(frame: FrameType, event: str, arg: Any) -> Any:
    if not _counting:
        return None
    name = _name(frame)
    _calls[name] += 1
    frame.f_trace_opcodes = True
    frame.f_trace_lines = False

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode" and _counting:
            _bytecodes[name] += 1
        return local

    return local


def _toggle(signum: int, frame: FrameType | None) -> None:
    global _counting
    _counting = not _counting


def main() -> None:
    out = sys.argv[1]
    sys.argv = ["headcount", *sys.argv[2:]]
    signal.signal(signal.SIGUSR1, _toggle)
    sys.settrace(_trace)
    try:
        runpy.run_module("headcount.cli", run_name="__main__")
    finally:
        sys.settrace(None)
        with open(out, "w") as sink:
            json.dump({"bytecodes": _bytecodes, "calls": _calls}, sink)


if __name__ == "__main__":
    main()
