"""`headcount demo` tells its story end to end: the ghost disappears and no request fails."""

from __future__ import annotations

import asyncio
import re

from headcount.sim.cluster import PYTHON_CLI

DEMO_TIMEOUT = 120.0


async def test_the_demo_runs_by_itself_and_reports_zero_failures() -> None:
    process = await asyncio.create_subprocess_exec(
        *PYTHON_CLI,
        "demo",
        "--duration",
        "1.5",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), DEMO_TIMEOUT)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = output.decode(errors="replace")
    assert process.returncode == 0, text[-3000:]
    sent = re.search(r"requests sent\s*[│|]\s*(\d+)", text)
    failed = re.search(r"requests failed\s*[│|]\s*(\d+)", text)
    truth = re.search(r"time to truth after the API came back\s*[│|]\s*([\d.]+) s", text)
    assert sent and failed and truth, text[-3000:]
    assert int(sent.group(1)) > 0
    assert int(failed.group(1)) == 0, text[-3000:]
    cut = re.search(r"cut mid-answer\s*[│|]\s*(\d+)", text)
    resumed = re.search(r"resumed on another engine \(mid-answer\)\s*[│|]\s*(\d+)", text)
    assert cut and resumed, text[-3000:]
    assert int(cut.group(1)) == 0, text[-3000:]  # the crashing engine's streams resumed
    assert float(truth.group(1)) < 2.0
    assert "ghost engine-c gone" in text
