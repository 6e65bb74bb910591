"""Bad input to `headcount serve`: one line naming the problem, status 2, never a traceback."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest

from headcount.sim.cluster import PYTHON_CLI
from headcount.sim.loopback import free_port


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PYTHON_CLI, "serve", "--host", "127.0.0.1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_clean_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, result.stderr
    for needle in needles:
        assert needle in error_lines[0], result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--backends", "ftp://x"], "ftp://x"),
        (["--port", "99999"], "invalid port"),
        (["--connect-timeout", "soon"], "invalid duration"),
        (["--discovery", "static"], "--backends"),
        (["--discovery", "k8s-pods", "--kubeconfig", "/nonexistent/kubeconfig"], "no such file"),
    ],
)
def test_invalid_flags_are_named(args: list[str], needle: str) -> None:
    assert_clean_error(serve(*args), needle)


def test_an_unreadable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("garbage: [\n")
    result = serve("--discovery", "k8s-pods", "--kubeconfig", str(kubeconfig), "--port", "0")
    assert_clean_error(result, "cannot be used")


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve("--backends", "http://127.0.0.1:1", "--port", str(port))
    assert_clean_error(result, f"cannot listen on 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("command", "ready_line"), [("sim-engine", b"listening on"), ("sim-apiserver", b"serving")]
)
def test_simulators_exit_cleanly_on_sigterm(command: str, ready_line: bytes) -> None:
    process = subprocess.Popen(
        [*PYTHON_CLI, command, "--port", str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        first_line = process.stdout.readline()
        assert ready_line in first_line, first_line
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
