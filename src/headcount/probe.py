"""Engine probes: what each engine serves (`/v1/models`) and how busy it is (`/metrics`).

The prober probes every engine once per interval, spread evenly over it so
the data plane never meets a burst of probes, and, through a fleet
subscription, new and changed engines at once. Probes run concurrently under a
bound, each with a timeout, and never more than one at a time per engine, so a
hung engine costs one timeout and N unreachable engines cost about one timeout,
not N. `/v1/models` decides health; `/metrics` is optional (an OpenAI-compatible
server without vLLM's metrics is routed to with unknown load).

Engine host names are looked up as the proxy does (`probe_resolver.py`: never
cached). A probe that fails for the router's own reasons, a failed lookup
(`dns: ...`) or no free fd, is recorded as inconclusive: the engine's state is
left as it was, so a short cluster-DNS outage cannot eject every engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from headcount._http.errors import LocalResourceExhausted, LookupFailed, local_resource
from headcount._http.resolve import Resolver
from headcount.clock import Sleep
from headcount.config import DnsSettings, ProbeSettings
from headcount.fleet import Engine, Fleet, FleetChange, ProbeResult
from headcount.probe_resolver import ProbeResolver

__all__ = ["Prober", "parse_model_cards", "parse_vllm_load"]

log = logging.getLogger(__name__)

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_WANTED = (_RUNNING, _WAITING, *_KV_USAGE)


class ProbeError(Exception):
    """A probe's answer was unusable; the message says how."""


def parse_model_cards(payload: object) -> tuple[Mapping[str, Any], ...]:
    """The `data` entries of an OpenAI `/v1/models` answer, each with a string `id`."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise ProbeError("/v1/models did not answer an OpenAI model list")
    cards = tuple(
        card
        for card in payload["data"]
        if isinstance(card, dict) and isinstance(card.get("id"), str)
    )
    if not cards:
        raise ProbeError("/v1/models lists no model")
    return cards


def parse_vllm_load(text: str) -> tuple[float, float, float | None]:
    """(running, waiting, kv-cache usage) summed over label sets from vLLM's `/metrics`.

    Reads only the few lines it needs; the newer `kv_cache_usage_perc` wins over
    the older `gpu_cache_usage_perc` when both are present.
    """
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        if name not in _WANTED:
            continue
        rest = line[line.find("}", name_end) + 1 :] if line[name_end] == "{" else line[name_end:]
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        sums[name] = sums.get(name, 0.0) + value
    kv = next((sums[name] for name in _KV_USAGE if name in sums), None)
    return sums.get(_RUNNING, 0.0), sums.get(_WAITING, 0.0), kv


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
    ) -> None:
        """`sleep` paces the rounds; each probe's timeout is the HTTP client's, in real time.
        `headers()` is sent with every probe request (the engine key, read at each probe).
        `resolver` is the proxy's (default: a fresh one with the default `DnsSettings`)."""
        self._headers = headers
        self._fleet = fleet
        self._settings = settings
        self._sleep = sleep
        self._resolver = resolver or Resolver(DnsSettings().timeout)
        self._limit = asyncio.Semaphore(settings.concurrency)
        self._probing: dict[str, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        fleet.subscribe(self._on_fleet_change)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout)
        connector = aiohttp.TCPConnector(
            limit=0,
            use_dns_cache=False,
            resolver=ProbeResolver(self._resolver),
            enable_cleanup_closed=True,
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
        if self._session is not None and change.to_probe:
            self._probe_ids(change.to_probe)

    def _probe_ids(self, engine_ids: tuple[str, ...]) -> None:
        for engine_id in engine_ids:
            if engine_id not in self._probing:
                task = asyncio.create_task(self._probe_one(engine_id), name=f"probe {engine_id}")
                self._probing[engine_id] = task

    async def _probe_one(self, engine_id: str) -> None:
        try:
            async with self._limit:
                engine = self._fleet.snapshot.by_id.get(engine_id)
                if engine is None or self._session is None:
                    return
                result = await self._probe(self._session, engine)
            self._record(engine, result)
        finally:
            self._probing.pop(engine_id, None)

    def _record(self, engine: Engine, result: ProbeResult) -> None:
        was_routable = engine.routable
        self._fleet.apply_probe(engine.id, result)
        now = self._fleet.snapshot.by_id.get(engine.id)
        if now is None or now.routable == was_routable:
            return
        if now.routable:
            log.info("engine %s ready: serves %s", engine.spec.name, ", ".join(now.served))
        else:
            log.warning(
                "engine %s out of rotation (%s): %s", engine.spec.name, now.state, result.error
            )

    async def _probe(self, session: aiohttp.ClientSession, engine: Engine) -> ProbeResult:
        models, load = await asyncio.gather(
            self._get(session, engine.url + "/v1/models"),
            self._get(session, engine.url + "/metrics"),
            return_exceptions=True,
        )
        if isinstance(models, BaseException):
            return _failed(models, "/v1/models")
        try:
            cards = parse_model_cards(json.loads(models))
        except (ValueError, ProbeError) as exc:
            return ProbeResult(ok=False, error=f"/v1/models: {exc}")
        running = waiting = 0.0
        kv: float | None = None
        if isinstance(load, str):
            running, waiting, kv = parse_vllm_load(load)
        return ProbeResult(ok=True, cards=cards, running=running, waiting=waiting, kv_usage=kv)

    async def _get(self, session: aiohttp.ClientSession, url: str) -> str:
        async with session.get(url, headers=self._headers()) as response:
            if response.status != 200:
                raise ProbeError(f"HTTP {response.status}")
            return await response.text()


def _failed(exc: BaseException, path: str) -> ProbeResult:
    """A failed probe; inconclusive when the failure is the router's own, not the engine's."""
    if isinstance(exc, LookupFailed):
        return ProbeResult(ok=False, error=f"dns: {exc}", inconclusive=True)
    resource = _local_resource(exc)
    if resource is not None:
        error = f"{path}: the router is out of {resource}: {exc}"
        return ProbeResult(ok=False, error=error, inconclusive=True)
    return ProbeResult(ok=False, error=_describe(exc, path))


def _local_resource(exc: BaseException) -> str | None:
    if isinstance(exc, LocalResourceExhausted):
        return exc.resource
    if isinstance(exc, aiohttp.ClientConnectorError):
        exc = exc.os_error
    return local_resource(exc) if isinstance(exc, OSError) else None


def _describe(exc: BaseException, path: str) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"{path}: no answer within the probe timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"{path}: cannot connect ({exc.os_error or exc})"
    return f"{path}: {exc or type(exc).__name__}"
