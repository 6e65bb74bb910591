"""Bad input to every command: one line naming the problem, status 2, never a traceback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from headcount.sim.cluster import PYTHON_CLI
from headcount.sim.loopback import free_port


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PYTHON_CLI, *args], capture_output=True, text=True, timeout=60, check=False
    )


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return run("serve", "--host", "127.0.0.1", *args)


def assert_clean_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The one `error:` line of a failed command (logs of its start may precede it)."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, result.stderr
    for needle in needles:
        assert needle in error_lines[0], result.stderr
    return error_lines[0]


def assert_only_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """An error found before anything starts: stderr is that one line and nothing else."""
    line = assert_clean_error(result, *needles)
    assert result.stderr == line + "\n", result.stderr


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


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
    assert_only_line(serve(*args), needle)


def test_an_argparse_error_is_one_line_pointing_at_help_not_the_usage() -> None:
    assert_only_line(
        serve("--port", "99999"), "headcount serve: error:", "(see headcount serve --help)"
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["serve", "--probe-intervall", "3"],
            "--probe-intervall: unknown flag; did you mean --probe-interval?",
        ),
        (["serve", "--log-formt=json"], "--log-formt: unknown flag; did you mean --log-format?"),
        (["sim-engine", "--token-dealy", "0.1"], "did you mean --token-delay?"),
        (["sim-apiserver", "--bookmark-intervl", "1"], "did you mean --bookmark-interval?"),
    ],
)
def test_a_mistyped_flag_is_blamed_on_its_command_with_the_nearest_flag(
    args: list[str], needle: str
) -> None:
    assert_only_line(run(*args), f"headcount {args[0]}: error:", needle)


def test_a_flag_like_no_other_is_unknown_without_a_guess() -> None:
    result = serve("--zzzzzz")
    assert_only_line(result, "--zzzzzz: unknown flag")
    assert "did you mean" not in result.stderr


def test_an_unknown_log_level_lists_the_levels_without_a_traceback() -> None:
    assert_only_line(
        serve("--backends", "http://127.0.0.1:1", "--log-level", "verbose"),
        "--log-level",
        "'VERBOSE'",
        "DEBUG",
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["serve", "--backends", "http://127.0.0.1:1", "--max-failovers", "-1"], "--max-failovers"),
        (["sim-engine", "--max-running", "0"], "--max-running must be at least 1"),
        (["sim-apiserver", "--bookmark-interval", "0"], "--bookmark-interval must be positive"),
        (
            ["serve", "--discovery", "k8s-pods", "--label-selector", "app in (a"],
            "--label-selector 'app in (a': unable to parse requirement: expected ')'",
        ),
    ],
)
def test_a_setting_that_cannot_be_used_is_one_line_naming_its_flag(
    args: list[str], needle: str
) -> None:
    assert_only_line(run(*args), f"headcount {args[0]}: error:", needle)


def test_an_unreadable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("garbage: [\n")
    result = serve("--discovery", "k8s-pods", "--kubeconfig", str(kubeconfig), "--port", "0")
    assert_clean_error(result, "cannot be used")


def test_a_port_in_use_is_a_clear_error(taken_port: int) -> None:
    result = serve("--backends", "http://127.0.0.1:1", "--port", str(taken_port))
    assert_clean_error(result, f"cannot listen on 127.0.0.1:{taken_port}")


def test_a_port_in_use_leaves_no_unclosed_api_client(tmp_path: Path, taken_port: int) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(_kubeconfig("http://127.0.0.1:1")))
    result = serve(
        "--discovery", "k8s-pods", "--kubeconfig", str(kubeconfig), "--port", str(taken_port)
    )
    assert_clean_error(result, f"cannot listen on 127.0.0.1:{taken_port}")
    assert "Unclosed" not in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["sim-engine", "sim-apiserver"])
def test_a_simulator_on_a_port_in_use_says_so_in_one_line(command: str, taken_port: int) -> None:
    result = run(command, "--port", str(taken_port))
    assert_only_line(
        result,
        f"headcount {command}: error: cannot listen on 127.0.0.1:{taken_port}: "
        "Address already in use",
    )


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


def _kubeconfig(server: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "n"}}],
        "current-context": "x",
    }
