"""A running simulated engine, as tests hold it: its address, its sockets and its fail mode.

This is the Python API (`SimEngine`, `start_engine`, `running_engine`); the
endpoints live in `openai`, `responses_api`, `tasks_api`, `tokenize_api`,
`probes`, `admin` and `kv_admin`, over the shared `state`. Tests may run its
timing on virtual time (`Timebase`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from headcount.sim.engine.admin import SimAdmin
from headcount.sim.engine.apikey import require_api_key
from headcount.sim.engine.config import EngineSimConfig, FailMode
from headcount.sim.engine.failures import check
from headcount.sim.engine.kv_admin import KvAdmin
from headcount.sim.engine.kv_events_api import KvEventsApi
from headcount.sim.engine.kv_publisher import KvEventPublisher
from headcount.sim.engine.kv_sink import KvEventSink
from headcount.sim.engine.openai import OpenAiApi
from headcount.sim.engine.probes import Probes
from headcount.sim.engine.responses_api import ResponsesApi
from headcount.sim.engine.state import EngineState
from headcount.sim.engine.tasks_api import TasksApi
from headcount.sim.engine.timebase import REAL_TIME, Timebase
from headcount.sim.engine.tokenize_api import TokenizeApi
from headcount.sim.engine.wire import ENGINE_NAME, REQUEST_ID
from headcount.tokens import load_tokenizer

__all__ = ["SimEngine", "running_engine", "start_engine"]

_SHUTDOWN_TIMEOUT = 1.0


class SimEngine:
    """A running simulated engine; get one from `start_engine` or `running_engine`."""

    def __init__(self, config: EngineSimConfig, timebase: Timebase = REAL_TIME) -> None:
        self.config = config
        self.port = config.port
        self._state = EngineState(config, timebase)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._tls: ssl.SSLContext | None = None
        self.kv_events = (
            KvEventPublisher(config.kv_events, config.host, self._reset_prefix_cache)
            if config.kv_events is not None
            else None
        )
        """The KV-event publisher (`config.kv_events`), a `KvEventSink`; None when off."""
        if self.kv_events is not None:
            self._state.set_kv_sink(self.kv_events)

    @property
    def name(self) -> str:
        """Reported in `x-engine-name`, `system_fingerprint` and stats: `config.name`, or
        `host:port` once listening."""
        return self._state.name

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        scheme = "http" if self.config.tls_cert is None else "https"
        return f"{scheme}://{host}:{self.port}"

    @property
    def fail_mode(self) -> FailMode:
        return self._state.failures.mode

    @property
    def after_chunks(self) -> int:
        """Chunks a stream sends before a mid-stream fail mode breaks it."""
        return self._state.failures.after_chunks

    async def set_fail_mode(self, mode: FailMode, *, after_chunks: int | None = None) -> None:
        """Switch failure mode; `refuse` closes socket and connections, others listen again.

        `after_chunks`, for the mid-stream modes only: the chunks a stream sends before
        it breaks (None: `config.die_after_chunks`). `ValueError` if it does not fit."""
        check(mode, after_chunks)
        await self._switch_fail_mode(mode, after_chunks, None)

    def set_adapters(self, adapters: list[str]) -> None:
        """Replace the LoRA adapters listed by `/v1/models` and accepted as `model`."""
        self._state.models.set_adapters(adapters)

    def stats(self) -> dict[str, object]:
        """What the engine has done and is doing, for tests: the body of `/sim/stats`."""
        return self._state.stats()

    def set_kv_sink(self, sink: KvEventSink) -> None:
        """Send the prefix cache's events to `sink` (a KV-event publisher)."""
        self._state.set_kv_sink(sink)

    def reset_prefix_cache(self, *, announce: bool) -> bool:
        """Forget the cached blocks: as vLLM's reset (`announce`, refused while requests hold
        blocks) or silently, as a restart."""
        return self._state.reset_prefix_cache(announce)

    async def drain(self, timeout: float = 10.0) -> None:
        """Stop as a terminating pod does: refuse new connections, finish what runs, then stop."""
        self._stop_listening()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._state.idle.wait(), timeout)
        await self.stop()

    async def stop(self) -> None:
        """Close the socket and every connection, cancelling whatever they were doing."""
        if self._state.stopping:
            return
        self._state.stopping = True
        self._stop_listening()
        self._drop_connections(keep=None)
        if self._runner is not None:
            await self._runner.cleanup()
        if self.kv_events is not None:
            await self.kv_events.close()

    def _reset_prefix_cache(self) -> None:
        """The KV-event `restart` fault's cache reset: silent, as a restarted engine's."""
        self._state.reset_prefix_cache(announce=False)

    async def _start(self) -> None:
        if self.config.tokenizer is not None:
            self._state.tokenizer = await asyncio.to_thread(load_tokenizer, self.config.tokenizer)
        self._tls = await asyncio.to_thread(_server_tls, self.config)
        app = web.Application()
        if self.config.api_key is not None:
            app.middlewares.append(require_api_key(self.config.api_key, self._state))
        app.on_response_prepare.append(self._stamp_headers)
        responses = ResponsesApi(self._state)
        app.on_cleanup.append(responses.close)
        app.add_routes(
            [
                *OpenAiApi(self._state).routes(),
                *responses.routes(),
                *TasksApi(self._state).routes(),
                *TokenizeApi(self._state).routes(),
                *Probes(self._state).routes(),
                *SimAdmin(self._state, self._switch_fail_mode).routes(),
                *KvAdmin(self._state).routes(),
            ]
        )
        if self.kv_events is not None:
            self.kv_events.start()
            app.add_routes(KvEventsApi(self.kv_events, self._state.failures).routes())
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=_SHUTDOWN_TIMEOUT,
        )
        await self._runner.setup()
        await self._listen()
        if not self._state.name:
            self._state.name = f"{self.config.host}:{self.port}"
        if self.fail_mode == "refuse":
            self._stop_listening()

    async def _listen(self) -> None:
        assert self._runner is not None and self._runner.server is not None
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            self._runner.server,
            self.config.host,
            self.port,
            reuse_address=True,
            backlog=1024,
            ssl=self._tls,
        )
        self.port = self._listener.sockets[0].getsockname()[1]

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _drop_connections(self, keep: web.RequestHandler | None) -> None:
        server = self._runner.server if self._runner is not None else None
        for handler in server.connections if server is not None else ():
            if handler is not keep:
                handler.force_close()

    async def _switch_fail_mode(
        self, mode: FailMode, after_chunks: int | None, keep: web.RequestHandler | None
    ) -> None:
        """`refuse` stops listening and drops every connection but `keep`; any other mode
        listens again, unless stopping."""
        chunks = self.config.die_after_chunks if after_chunks is None else after_chunks
        self._state.failures.switch(mode, chunks)
        if mode == "refuse":
            self._stop_listening()
            self._drop_connections(keep)
        elif self._listener is None and not self._state.stopping:
            await self._listen()

    async def _stamp_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[ENGINE_NAME] = self._state.name
        request_id = request.headers.get(REQUEST_ID)
        if request_id is not None:
            response.headers[REQUEST_ID] = request_id


def _server_tls(config: EngineSimConfig) -> ssl.SSLContext | None:
    """The https side of `config.tls_*`, None for plain HTTP (reads the files: a thread)."""
    if config.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca is not None:
        context.load_verify_locations(cafile=config.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def start_engine(config: EngineSimConfig, timebase: Timebase = REAL_TIME) -> SimEngine:
    """Start an engine listening on `config.host`; stop it with `await engine.stop()`."""
    engine = SimEngine(config, timebase)
    try:
        await engine._start()
    except BaseException:
        await engine.stop()
        raise
    return engine


@contextlib.asynccontextmanager
async def running_engine(
    config: EngineSimConfig, timebase: Timebase = REAL_TIME
) -> AsyncIterator[SimEngine]:
    """`async with running_engine(config) as engine:` an engine for the block's duration."""
    engine = await start_engine(config, timebase)
    try:
        yield engine
    finally:
        await engine.stop()
