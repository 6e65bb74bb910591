"""Graceful shutdown of a real router process: SIGTERM as Kubernetes sends it during a rollout.

On SIGTERM `/readyz` fails at once (so the endpoint is removed) while new
requests are still served for `--drain-delay` (endpoint removal takes time to
propagate); then the listener closes, in-flight streams get `--drain-timeout`
to finish, and the process exits 0. Each test runs `headcount serve` in static
mode in front of a simulated engine slow enough that a stream outlives the
signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from headcount.config import DiscoveryMode
from headcount.sim.cluster import RouterFlags, RouterProcess, Timings
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine
from tests.support import wait_until

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

MODEL = "sim-model"
TOKEN_DELAY = 0.05
EXIT_MARGIN = 3.0
"""Slack for the process to tear down and exit on a loaded 2-core machine."""
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=15)


@contextlib.asynccontextmanager
async def router_before(
    engine: SimEngine, *, drain_delay: float, drain_timeout: float
) -> AsyncIterator[RouterProcess]:
    flags = RouterFlags(
        discovery=DiscoveryMode.STATIC,
        backends=(engine.url,),
        timings=Timings(probe_interval=0.2, drain_delay=drain_delay, drain_timeout=drain_timeout),
    )
    async with RouterProcess(flags) as router:

        async def routable() -> bool:
            body = await router.client.health()
            return bool(body["status"] == "ok")

        await wait_until(routable, timeout=10, what="engine probed and routable")
        yield router


@contextlib.asynccontextmanager
async def slow_engine() -> AsyncIterator[SimEngine]:
    async with running_engine(EngineSimConfig(model=MODEL, token_delay=TOKEN_DELAY)) as engine:
        yield engine


class Stream:
    """One streamed chat completion read to its end (or its cut) in the background."""

    def __init__(self, url: str, tokens: int) -> None:
        self.started = asyncio.Event()
        self.body = b""
        self.error: BaseException | None = None
        self._task = asyncio.create_task(self._read(url, tokens))

    async def _read(self, url: str, tokens: int) -> None:
        payload = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "tell me a long story"}],
            "max_tokens": tokens,
            "stream": True,
        }
        try:
            async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
                async with session.post(url + "/v1/chat/completions", json=payload) as response:
                    assert response.status == 200
                    async for chunk in response.content.iter_any():
                        self.body += chunk
                        self.started.set()
        except aiohttp.ClientError as exc:
            self.error = exc

    @property
    def done(self) -> bool:
        return self._task.done()

    async def finished(self, timeout: float) -> bytes:
        await asyncio.wait_for(self._task, timeout)
        return self.body


def content_of(body: bytes) -> tuple[str, list[str | None]]:
    """The streamed text and every chunk's finish_reason."""
    text, reasons = [], []
    for line in body.decode().split("\n\n"):
        if not line.startswith("data: {"):
            continue
        choice = json.loads(line.removeprefix("data: "))["choices"][0]
        text.append(choice["delta"].get("content") or "")
        reasons.append(choice["finish_reason"])
    return "".join(text), reasons


async def refuses_connections(port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def exit_code(router: RouterProcess, timeout: float) -> int | None:
    assert router.process is not None
    await asyncio.wait_for(router.process.wait(), timeout)
    return await router.stop()


async def test_sigterm_fails_readiness_keeps_serving_then_lets_the_stream_finish() -> None:
    drain_delay, drain_timeout = 1.0, 5.0
    async with (
        slow_engine() as engine,
        router_before(engine, drain_delay=drain_delay, drain_timeout=drain_timeout) as router,
    ):
        assert router.process is not None
        assert await router.client.status_of("/readyz") == 200
        stream = Stream(router.url, tokens=30)  # about 1.5 s
        await asyncio.wait_for(stream.started.wait(), 5)

        router.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        async def not_ready() -> bool:
            return await router.client.status_of("/readyz") == 503

        await wait_until(not_ready, timeout=0.5, interval=0.02, what="/readyz 503")
        assert await router.client.status_of("/livez") == 200
        status, _ = await router.client.chat(MODEL, max_tokens=1)
        assert status == 200, "new requests are served during the drain delay"
        assert time.monotonic() - signalled < drain_delay, "the request came after the delay"

        body = await stream.finished(timeout=drain_delay + drain_timeout)
        assert stream.error is None
        assert body.endswith(b"data: [DONE]\n\n")
        text, reasons = content_of(body)
        assert len(reasons) == 30
        assert reasons[-1] == "length"
        assert text

        code = await exit_code(router, timeout=drain_delay + drain_timeout + EXIT_MARGIN)
        assert code == 0
        assert time.monotonic() - signalled < drain_delay + drain_timeout + EXIT_MARGIN
        assert "drained: no request in flight" in router.log()


async def test_after_the_drain_delay_new_connections_are_refused_while_streams_finish() -> None:
    drain_delay, drain_timeout = 0.3, 10.0
    async with (
        slow_engine() as engine,
        router_before(engine, drain_delay=drain_delay, drain_timeout=drain_timeout) as router,
    ):
        assert router.process is not None
        stream = Stream(router.url, tokens=60)  # about 3 s
        await asyncio.wait_for(stream.started.wait(), 5)

        router.process.send_signal(signal.SIGTERM)
        await wait_until(
            lambda: refuses_connections(router.port),
            timeout=drain_delay + 2,
            what="listener closed",
        )
        assert not stream.done, "the stream ended before the listener closed"
        assert router.process.returncode is None

        body = await stream.finished(timeout=drain_timeout)
        assert body.endswith(b"data: [DONE]\n\n")
        assert len(content_of(body)[1]) == 60
        assert await exit_code(router, timeout=EXIT_MARGIN) == 0


async def test_a_stream_longer_than_the_drain_timeout_is_cut_and_the_process_exits_0() -> None:
    drain_delay, drain_timeout = 0.2, 1.0
    async with (
        slow_engine() as engine,
        router_before(engine, drain_delay=drain_delay, drain_timeout=drain_timeout) as router,
    ):
        assert router.process is not None
        stream = Stream(router.url, tokens=200)  # about 10 s
        await asyncio.wait_for(stream.started.wait(), 5)

        router.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = await exit_code(router, timeout=drain_delay + drain_timeout + EXIT_MARGIN)
        assert code == 0
        assert time.monotonic() - signalled < drain_delay + drain_timeout + EXIT_MARGIN

        body = await stream.finished(timeout=EXIT_MARGIN)
        assert not body.endswith(b"data: [DONE]\n\n")
        assert len(content_of(body)[1]) < 200
        await wait_until(lambda: "drain timeout 1s: closing 1 requests" in router.log())


async def test_a_second_signal_skips_the_rest_of_the_drain() -> None:
    drain_delay, drain_timeout = 20.0, 20.0
    async with (
        slow_engine() as engine,
        router_before(engine, drain_delay=drain_delay, drain_timeout=drain_timeout) as router,
    ):
        assert router.process is not None
        stream = Stream(router.url, tokens=400)
        await asyncio.wait_for(stream.started.wait(), 5)
        router.process.send_signal(signal.SIGTERM)

        async def draining() -> bool:
            return await router.client.status_of("/readyz") == 503

        await wait_until(draining, timeout=5, what="the first signal taken")
        router.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert await exit_code(router, timeout=EXIT_MARGIN + 2) == 0, router.log()
        assert time.monotonic() - started < EXIT_MARGIN + 2
        assert "asked again to stop: closing 1 requests now" in router.log()
        await stream.finished(5)
        assert not stream.body.endswith(b"data: [DONE]\n\n")
