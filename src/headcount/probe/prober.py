"""Engine probes: what each engine serves (`/v1/models`) and how busy it is (`/metrics`).

The prober probes every engine once per interval, spread evenly over it so
the data plane never meets a burst of probes, and, through a fleet
subscription, new and changed engines at once. Probes run concurrently under a
bound, each with a timeout, and never more than one at a time per engine, so a
hung engine costs one timeout and N unreachable engines cost about one timeout,
not N. `/v1/models` decides health; `/metrics` is optional (an OpenAI-compatible
server without vLLM's metrics is routed to with unknown load).

An engine's answers are untrusted: each is read up to `max_bytes` and parsed
as it streams in (`model_list`, `vllm_load`), a few KiB at a time with the
event loop free in between, so no answer stalls the router or grows its
memory. Any exception while probing an engine is a failed probe with a
reason, never a dead task. The fleet logs what a probe changes (an engine
ready, unhealthy); the prober logs a failure that changes no state once per
engine until its reason changes, and the traceback of any exception that is
not one an engine or the network can cause.

An https engine is probed with the proxy's `EngineTls` (the same CA, client
certificate and server name); a handshake that fails says why, in the engine's
error (`certificate verify failed: ...`).

Engine host names are looked up as the proxy does (`resolver.py`: never
cached). A probe that fails for the router's own reasons, a failed lookup
(`dns: ...`), no free fd, or a timeout that fired well past its time (the
router's own event loop was blocked, so the answer may be sitting unread), is
recorded as inconclusive: the engine's state is left as it was, so a short
cluster-DNS outage or a stalled router cannot eject every engine.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

import aiohttp

from headcount._http.errors import LocalResourceExhausted, LookupFailed, local_resource
from headcount._http.resolve import Resolver
from headcount._http.tls import EngineTls, tls_failure
from headcount.clock import Sleep
from headcount.config import DnsSettings, ProbeSettings
from headcount.fleet import Engine, Fleet, FleetChange, ProbeResult
from headcount.fleet.vllm_load import LoadParser, VllmLoad
from headcount.probe.model_list import ModelListError, ModelListParser
from headcount.probe.resolver import ProbeResolver

__all__ = ["ProbeError", "Prober"]

_log = logging.getLogger("headcount.probe")

_STEP = 4 * 1024
"""Bytes of an answer parsed between two turns of the event loop: well under a millisecond of
work for common answers, a few for the costliest JSON an engine can craft."""


class ProbeError(Exception):
    """A probe's answer was unusable; the message says how."""


_EXPECTED = (
    ProbeError,
    ModelListError,
    LookupFailed,
    LocalResourceExhausted,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    OSError,
)
"""What an engine, the network or the router's own limits can cause; anything else is logged
with its traceback."""


class _AnswerParser(Protocol):
    """What reads one answer as it streams in (`ModelListParser`, `LoadParser`)."""

    @property
    def full(self) -> bool:
        """Enough read: the rest of the answer is not wanted."""

    def feed(self, data: bytes) -> None: ...


class Prober:
    """Keeps every engine's probe state current; start with `run()`, stop by cancelling it."""

    def __init__(
        self,
        fleet: Fleet,
        settings: ProbeSettings,
        *,
        sleep: Sleep = asyncio.sleep,
        headers: Callable[[], Mapping[str, str] | None] = lambda: None,
        resolver: Resolver | None = None,
        tls: EngineTls | None = None,
    ) -> None:
        """`sleep` paces the rounds; each probe's timeout is the HTTP client's, in real time.
        `headers()` is sent with every probe request (the engine key, read at each probe).
        `resolver` is the proxy's (default: a fresh one with the default `DnsSettings`).
        `tls`: the proxy's, for https engines (default: aiohttp's, the system's CAs)."""
        self._headers = headers
        self._tls = tls
        self._fleet = fleet
        self._settings = settings
        self._sleep = sleep
        self._resolver = resolver or Resolver(DnsSettings().timeout)
        self._limit = asyncio.Semaphore(settings.concurrency)
        self._probing: dict[str, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._told: dict[tuple[str, str], str] = {}
        """(engine id, topic) -> the reason last logged, so a steady failure is logged once."""
        fleet.subscribe(self._on_fleet_change)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout)
        connector = aiohttp.TCPConnector(
            limit=0,
            use_dns_cache=False,
            resolver=ProbeResolver(self._resolver),
            enable_cleanup_closed=True,
            ssl=True if self._tls is None else self._tls.context,
        )
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            self._session = session
            self._probe_ids(tuple(self._fleet.snapshot.by_id))
            try:
                while True:
                    await self._probe_round()
            finally:
                self._session = None
                for task in self._probing.values():
                    task.cancel()
                await asyncio.gather(*self._probing.values(), return_exceptions=True)
                self._probing.clear()  # a task cancelled before it ran never removed itself

    async def _probe_round(self) -> None:
        """Probe every engine once, spread evenly over the interval: no probe storms."""
        engine_ids = tuple(self._fleet.snapshot.by_id)
        if not engine_ids:
            await self._sleep(self._settings.interval)
            return
        step = self._settings.interval / len(engine_ids)
        for engine_id in engine_ids:
            await self._sleep(step)
            self._probe_ids((engine_id,))

    def _on_fleet_change(self, change: FleetChange) -> None:
        for engine_id in change.removed:
            for topic in ("probe", "/metrics", "models"):
                self._told.pop((engine_id, topic), None)
        if self._session is not None and change.to_probe:
            self._probe_ids(change.to_probe)

    def _probe_ids(self, engine_ids: tuple[str, ...]) -> None:
        for engine_id in engine_ids:
            if engine_id not in self._probing:
                task = asyncio.create_task(self._probe_one(engine_id), name=f"probe {engine_id}")
                self._probing[engine_id] = task
                task.add_done_callback(_observe)

    async def _probe_one(self, engine_id: str) -> None:
        try:
            async with self._limit:
                engine = self._fleet.snapshot.by_id.get(engine_id)
                if engine is None or self._session is None:
                    return
                try:
                    result, unexpected = await self._probe(self._session, engine)
                except Exception as exc:
                    result = ProbeResult(ok=False, error=f"probe: {_describe(exc)}")
                    unexpected = exc
            self._record(engine, result, unexpected)
        finally:
            self._probing.pop(engine_id, None)

    def _record(
        self, engine: Engine, result: ProbeResult, unexpected: BaseException | None
    ) -> None:
        """Apply a probe (the fleet logs a change of state); log a failure that changed none,
        or came from an unforeseen exception, once until its reason changes."""
        self._fleet.apply_probe(engine.id, result)
        now = self._fleet.snapshot.by_id.get(engine.id)
        if now is None:
            return
        told = self._told.get((engine.id, "probe"))
        if (
            result.error is not None
            and told != result.error
            and (now.state is engine.state or unexpected is not None)
        ):
            _log.warning(
                "engine %s failed a probe (%s): %s",
                engine.spec.name,
                now.state,
                result.error,
                exc_info=unexpected,
                extra={
                    "event": "probe_failed",
                    "engine": engine.spec.name,
                    "url": engine.url,
                    "state": str(now.state),
                    "reason": result.error,
                },
            )
        if result.error is None:
            self._told.pop((engine.id, "probe"), None)
        else:
            self._told[(engine.id, "probe")] = result.error

    async def _probe(
        self, session: aiohttp.ClientSession, engine: Engine
    ) -> tuple[ProbeResult, BaseException | None]:
        """The probe's result, and the exception nobody foresaw if one decided it."""
        cards_parser = ModelListParser(self._settings.max_models)
        load_parser = LoadParser()
        started = time.monotonic()
        models, load = await asyncio.gather(
            self._read(session, engine.url + "/v1/models", cards_parser),
            self._read(session, engine.url + "/metrics", load_parser),
            return_exceptions=True,
        )
        if isinstance(models, BaseException):
            late = time.monotonic() - started - self._settings.timeout
            if isinstance(models, asyncio.TimeoutError) and late > _blocked_after(
                self._settings.timeout
            ):
                error = (
                    f"/v1/models: timed out {late:.1f}s late: the router's own loop was "
                    "blocked, the answer may be unread"
                )
                return ProbeResult(ok=False, error=error, inconclusive=True), None
            unexpected = None if isinstance(models, _EXPECTED) else models
            failed = _failed(models, "/v1/models")
            hint = self._hung_up_hint(engine, models)
            if hint:
                failed = replace(failed, error=f"{failed.error}: {hint}")
            return failed, unexpected
        try:
            cards = cards_parser.close()
        except ModelListError as exc:
            return ProbeResult(ok=False, error=f"/v1/models: {exc}"), None
        if cards_parser.full:
            self._tell_once(
                engine,
                "models",
                logging.WARNING,
                f"lists more than {self._settings.max_models} models: the rest are ignored "
                "(--probe-max-models)",
            )
        figures = VllmLoad()
        if isinstance(load, BaseException):
            unexpected = None if isinstance(load, _EXPECTED) else load
            self._tell_once(
                engine,
                "/metrics",
                logging.INFO if unexpected is None else logging.WARNING,
                f"load unknown, /metrics: {_describe(load)}",
                unexpected,
            )
        else:
            self._told.pop((engine.id, "/metrics"), None)
            figures = load_parser.close()
        result = ProbeResult(ok=True, cards=cards, load=figures)
        return result, None

    def _hung_up_hint(self, engine: Engine, exc: BaseException) -> str:
        """Why an https engine may hang up before answering: TLS servers (aiohttp's, uvicorn's)
        close without a word on a client that brought no certificate they require."""
        tls = self._tls
        if (
            isinstance(exc, aiohttp.ServerDisconnectedError)
            and tls is not None
            and not tls.client_certificate
            and engine.url.startswith("https://")
        ):
            return "no client certificate was sent: does it require one (--engine-tls-cert-file)?"
        return ""

    def _tell_once(
        self,
        engine: Engine,
        topic: str,
        level: int,
        message: str,
        unexpected: BaseException | None = None,
    ) -> None:
        """Log `message` unless it is what was last logged about `topic` for this engine."""
        if self._told.get((engine.id, topic)) == message:
            return
        self._told[(engine.id, topic)] = message
        _log.log(level, "engine %s: %s", engine.spec.name, message, exc_info=unexpected)

    async def _read(self, session: aiohttp.ClientSession, url: str, parser: _AnswerParser) -> None:
        """Feed the answer at `url` to `parser` until it ends, the parser is full, or the answer
        passes `max_bytes` (a `ProbeError`); the loop turns between two steps of parsing. A
        declared length over `max_bytes` is no reason to stop early: the parser may be full
        before (the first 10,000 cards of a listing of 200,000 adapters)."""
        limit = self._settings.max_bytes
        server_name = None if self._tls is None else self._tls.server_name
        async with session.get(
            url, headers=self._headers(), server_hostname=server_name
        ) as response:
            if response.status != 200:
                raise ProbeError(f"HTTP {response.status}")
            received = 0
            pending = bytearray()
            async for chunk in response.content.iter_chunked(_STEP):
                received += len(chunk)
                if received > limit:
                    raise ProbeError(f"answer over {limit} bytes")
                pending += chunk
                if len(pending) >= _STEP:
                    parser.feed(bytes(pending))
                    pending.clear()
                    if parser.full:
                        return
                    await asyncio.sleep(0)
            parser.feed(bytes(pending))


def _blocked_after(timeout: float) -> float:
    """How late a probe's timeout may fire before the router, not the engine, is to blame:
    a timer fires within milliseconds of its time unless the loop was busy elsewhere."""
    return max(0.1, timeout / 4)


def _failed(exc: BaseException, path: str) -> ProbeResult:
    """A failed probe; inconclusive when the failure is the router's own, not the engine's."""
    if isinstance(exc, LookupFailed):
        return ProbeResult(ok=False, error=f"dns: {exc}", inconclusive=True)
    resource = _local_resource(exc)
    if resource is not None:
        error = f"{path}: the router is out of {resource}: {exc}"
        return ProbeResult(ok=False, error=error, inconclusive=True)
    return ProbeResult(ok=False, error=f"{path}: {_describe(exc)}")


def _local_resource(exc: BaseException) -> str | None:
    if isinstance(exc, LocalResourceExhausted):
        return exc.resource
    if isinstance(exc, aiohttp.ClientConnectorError):
        exc = exc.os_error
    return local_resource(exc) if isinstance(exc, OSError) else None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer within the probe timeout"
    if isinstance(exc, aiohttp.ClientSSLError) and isinstance(exc.os_error, ssl.SSLError):
        return f"TLS handshake failed: {tls_failure(exc.os_error)}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error or exc})"
    if isinstance(exc, _EXPECTED):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"[:200]


def _observe(task: asyncio.Task[None]) -> None:
    """Log what escaped a probe task (a bug in the fleet, say): never an unobserved exception."""
    if not task.cancelled() and (error := task.exception()) is not None:
        _log.error("%s failed", task.get_name(), exc_info=error)
