"""Authentication in `headcount serve` as deployed: flags, SIGHUP, the admin port, the log.

The router and a `headcount sim-engine --api-key` run as child processes, as in
a pod beside a vLLM started with `--api-key`; they are judged from outside
only: HTTP answers on both ports, exit statuses, and the whole log, which must
never hold a key.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import openai
import pytest

from headcount.sim.cluster import PYTHON_CLI, RouterClient
from headcount.sim.cluster.process import stop_child
from headcount.sim.loopback import free_port
from tests.support import wait_until

__all__: list[str] = []

pytestmark = pytest.mark.timeout(90)

HOST = "127.0.0.1"
MODEL = "sim-model"
CLIENT_KEY = "sk-proc-client-0b5e"
ROTATED_KEY = "sk-proc-client-9d2a"
ENGINE_KEY = "sk-proc-engine-6f71"
SECRETS = (CLIENT_KEY, ROTATED_KEY, ENGINE_KEY)


@asynccontextmanager
async def process(argv: list[str], log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    with log.open("wb") as out:
        child = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
        try:
            yield child
        finally:
            await stop_child(child)


async def answers(client: RouterClient, path: str, status: int) -> bool:
    try:
        return await client.status_of(path) == status
    except aiohttp.ClientError:
        return False


async def status_with_key(url: str, key: str | None) -> int:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.get(url, headers=headers) as response:
            return response.status


async def refused_count(admin: RouterClient) -> float:
    """`headcount_requests_total` of code 401, from the admin port's `/metrics`."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in (await admin.metrics()).splitlines()
        if line.startswith("headcount_requests_total{") and 'code="401"' in line
    )


async def chat(sdk: openai.AsyncOpenAI) -> str:
    reply = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return reply.choices[0].message.content or ""


async def test_serve_with_keys_and_an_admin_port_reloads_on_sighup_and_logs_no_key(
    tmp_path: Path,
) -> None:
    keys_file, engine_key_file = tmp_path / "keys", tmp_path / "engine-key"
    keys_file.write_text(f"# clients\n{CLIENT_KEY}\n")
    engine_key_file.write_text(ENGINE_KEY + "\n")
    engine_port, port, admin_port = free_port(HOST), free_port(HOST), free_port(HOST)
    engine = [*PYTHON_CLI, "sim-engine", f"--port={engine_port}", f"--api-key={ENGINE_KEY}"]
    router = [
        *PYTHON_CLI,
        "serve",
        f"--host={HOST}",
        f"--port={port}",
        f"--admin-port={admin_port}",
        f"--backends=http://{HOST}:{engine_port}",
        "--probe-interval=0.2",
        "--drain-delay=0",
        f"--api-keys-file={keys_file}",
        f"--engine-api-key-file={engine_key_file}",
        "--log-level=DEBUG",
    ]
    router_log = tmp_path / "router.log"
    admin = RouterClient(f"http://{HOST}:{admin_port}")
    api = RouterClient(f"http://{HOST}:{port}")
    sdk = openai.AsyncOpenAI(
        base_url=f"http://{HOST}:{port}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=10
    )
    rotated = openai.AsyncOpenAI(
        base_url=f"http://{HOST}:{port}/v1", api_key=ROTATED_KEY, max_retries=0, timeout=10
    )
    try:
        async with (
            process(engine, tmp_path / "engine.log"),
            process(router, router_log) as child,
        ):

            async def routable() -> bool:
                if child.returncode is not None:
                    raise AssertionError(router_log.read_text())
                if not await answers(admin, "/health", 200):
                    return False
                return bool((await admin.health())["engines"]["routable"] == 1)

            await wait_until(routable, timeout=20, what="the keyed engine routable")
            assert await chat(sdk)
            for path in ("/engines", "/metrics", "/livez", "/readyz", "/health"):
                # On the API port: not there for a client with a key; health needs no key.
                assert await status_with_key(api.url + path, CLIENT_KEY) == 404
                if path in ("/engines", "/metrics"):
                    assert await api.status_of(path) == 401
                status, text = await admin.get(path)
                assert status == 200 and all(secret not in text for secret in SECRETS)
            assert await admin.status_of("/v1/models") == 404
            with pytest.raises(openai.AuthenticationError):
                await chat(rotated)

            # An in-place rewrite that keeps inode, size and mtime: only SIGHUP sees it.
            before = os.stat(keys_file)
            with keys_file.open("r+") as file:
                file.write(f"# clients\n{ROTATED_KEY}\n")
            os.utime(keys_file, ns=(before.st_atime_ns, before.st_mtime_ns))
            child.send_signal(signal.SIGHUP)

            async def reloaded() -> bool:
                try:
                    return bool(await chat(rotated))
                except openai.AuthenticationError:
                    return False

            await wait_until(reloaded, timeout=10, what="the rotated key admitted")
            refused_before = await refused_count(admin)
            with pytest.raises(openai.AuthenticationError):
                await chat(sdk)
            assert await refused_count(admin) == refused_before + 1
        assert child.returncode == 0
    finally:
        await sdk.close()
        await rotated.close()
    log = router_log.read_text()
    assert "reloading 2 key file(s)" in log and "--api-keys-file" in log
    for secret in SECRETS:
        assert secret not in log


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PYTHON_CLI, "serve", "--host", "127.0.0.1", "--backends", "http://127.0.0.1:9", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("flag", ["--api-keys-file", "--engine-api-key-file", "--tenants-file"])
def test_an_unusable_key_file_stops_serve_with_one_line_naming_the_flag(
    flag: str, tmp_path: Path
) -> None:
    path = tmp_path / "keys"
    path.write_text("sk-proc-secret-and garbage\n")
    result = serve(flag, str(path), "--port", str(free_port(HOST)))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and flag in errors[0], result.stderr
    assert "secret" not in result.stderr and "secret" not in result.stdout


def test_the_admin_port_in_use_is_a_clear_error() -> None:
    port = free_port(HOST)
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        admin_port = taken.getsockname()[1]
        result = serve("--port", str(port), "--admin-port", str(admin_port))
    assert result.returncode == 2, result.stderr
    assert f"--admin-port {admin_port}" in result.stderr and "Traceback" not in result.stderr
