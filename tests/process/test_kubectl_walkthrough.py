"""The README's "Try Kubernetes mode locally" walkthrough, run as written with the real kubectl.

The commands are taken from the README itself, so the documentation cannot
drift from what works; only its ports and addresses are swapped for free ones,
so the walkthrough runs beside other tests.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from headcount.sim.loopback import free_port, free_port_on_all
from tests.support import REPO

README = REPO / "README.md"
KUBECTL = os.environ.get("HEADCOUNT_KUBECTL", "")
SCRIPT_TIMEOUT = 90
ENGINES = ("127.0.0.41", "127.0.0.42")

needs_kubectl = pytest.mark.skipif(
    not KUBECTL, reason="HEADCOUNT_KUBECTL is unset: `make pytest` extracts Debian's kubectl"
)


def walkthrough() -> str:
    """The first ``sh`` block of the README's "Try Kubernetes mode locally" section."""
    text = README.read_text()
    section = text.split("## Try Kubernetes mode locally", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the section has no sh block"
    return match.group(1)


def on_free_ports(script: str) -> str:
    """The script with its fixed ports and engine addresses swapped for free ones."""
    swaps = {
        "6443": str(free_port()),
        "6444": str(free_port()),
        "8080": str(free_port()),
        "127.0.0.11": ENGINES[0],
        "127.0.0.12": ENGINES[1],
        "8000": str(free_port_on_all(ENGINES)),
    }
    for fixed, free in swaps.items():
        assert fixed in script, f"the walkthrough no longer uses {fixed}"
        script = script.replace(fixed, free)
    return script


def test_the_walkthrough_is_in_the_readme() -> None:
    script = walkthrough()
    for command in ("kubectl apply -f", "kubectl delete pod", "/_sim/faults/refuse", "/engines"):
        assert command in script


@needs_kubectl
def test_readme_walkthrough_runs_with_real_kubectl(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(KUBECTL)
    (bin_dir / "headcount").write_text(f'#!/bin/sh\nexec {sys.executable} -m headcount.cli "$@"\n')
    (bin_dir / "headcount").chmod(0o755)
    assert shutil.which("curl"), "the walkthrough uses curl"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    log = tmp_path / "walkthrough.log"  # a file: the engines it starts would hold a pipe open
    with log.open("w") as output:
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", on_free_ports(walkthrough())],
            cwd=tmp_path,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        process.wait(timeout=SCRIPT_TIMEOUT)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever the script left running
        process.wait()
    out = log.read_text()
    assert process.returncode == 0, out
    assert "pod/engine-a created" in out and "pod/engine-b created" in out, out
    assert re.search(r"engine-a\s+1/1\s+Running", out), out
    assert '"chat.completion"' in out, out
    assert 'pod "engine-b" deleted' in out, out
    assert '"refusingForSeconds"' in out, out
