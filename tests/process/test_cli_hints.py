"""What `serve` accepts but probably does not mean is logged once as it starts, with a hint.

`headcount serve` runs as a child process; the hints themselves are
tests/unit/test_cli_hints.py.
"""

from __future__ import annotations

import signal
import subprocess

from headcount.sim.cluster import PYTHON_CLI
from headcount.sim.loopback import free_port


def test_the_router_logs_each_hint_once_and_starts() -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            *PYTHON_CLI,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backends",
            "http://127.0.0.1:1/v1",
            "--namespace",
            "llm",
            "--drain-delay",
            "0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "headcount listening" in line or len(lines) > 50:
                break
        process.send_signal(signal.SIGTERM)
        lines += process.stderr.readlines()
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    warnings = [line for line in lines if "WARNING headcount.cli:" in line]
    assert len(warnings) == 2, lines
    assert "using http://127.0.0.1:1 " in warnings[0]
    assert "--namespace: not used with --discovery static" in warnings[1]
    assert any("headcount listening" in line for line in lines), lines
