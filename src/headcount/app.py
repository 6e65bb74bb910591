"""Wiring: builds the fleet, discovery, prober, proxy and health from `Settings`, and runs them.

Nothing here decides anything; it starts the pieces, watches that the discovery
loops stay alive (a dead loop fails `/livez` and is logged), judges health on a
tick (`HealthWatch`: status changes logged, the 503's reason), keeps the other
long-lived tasks going under a `Supervisor` (a crash is logged, counted and
restarted), and runs the shutdown sequence: on SIGTERM readiness fails at
once, new requests are still served for `drain_delay`, then the listener
closes and in-flight requests get up to `drain_timeout` to finish; a second
signal ends the drain at once. The admin listener (`--admin-port`), if any,
stays open until the end. SIGHUP reloads the key files.

Once built, and before it serves, the process moves every object alive to the
collector's permanent generation (`gc.freeze`): what start-up made (modules,
settings, a tokenizer's vocabulary) lives as long as the process, and a full
collection would otherwise walk it all again, 20-30 ms on the event loop each
time, as often as requests leave surviving objects behind (bench/RESULTS.md).

With `--routing kv-aware` (only then), `build_kv_wiring` loads the tokenizer
and builds the engines' KV-event indexes (`KvIndexes`, one subscriber per
engine, following the fleet); the router starts them with discovery, hands them
to the policy and to `/engines`, `/health` and `/metrics`, and closes them at
the end; with `--kv-placement on`, the placement plan's stream likewise.

Over 450 lines: it is where every part is started and stopped, in the order
the shutdown sequence needs; split, that order would be spread over modules.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from headcount._http.acceptor import ClientListener
from headcount._http.resolve import Resolver, pinned_first
from headcount._http.resources import raise_open_file_limit, release_large_allocations
from headcount._http.tls import EngineTls, build_engine_tls
from headcount.auth import Authentication, Credentials
from headcount.auth.tenants import Tenants
from headcount.compiled import data_plane, stale_compiled
from headcount.config import (
    BUILTIN_TOKENIZER,
    ConfigError,
    DiscoveryMode,
    KvEventsSettings,
    RoutingName,
    Settings,
)
from headcount.discovery.source import DiscoverySource
from headcount.discovery.static import StaticSource
from headcount.fleet import Fleet
from headcount.flow.control import FlowControl
from headcount.flow.limits import LimitsStore
from headcount.flow.redis_store import RedisStore
from headcount.flow.window import MemoryStore
from headcount.gateway import build_picker, picker_credentials
from headcount.probe.prober import Prober
from headcount.proxy import Proxy, start_local_server, start_server
from headcount.routing import Policy, make_policy
from headcount.routing.kv import KvRouting
from headcount.routing.kv.planning import Placement
from headcount.supervise import Supervisor
from headcount.surfaces.admin import AdminApp
from headcount.surfaces.flow_metrics import FlowCollector
from headcount.surfaces.grpc_health import GrpcHealthServer
from headcount.surfaces.health_watch import HealthWatch
from headcount.surfaces.metrics import Metrics
from headcount.tokens import ChatTokenizer, TokenizerError, builtin_tokenizer, load_tokenizer

if TYPE_CHECKING:
    from headcount.kvindex.registry import KvIndexes

__all__ = [
    "KvWiring",
    "Router",
    "build_kv_wiring",
    "build_sources",
    "load_router_tokenizer",
    "serve",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KvWiring:
    """What `--routing kv-aware` adds to a router: the engines' indexes, and the policy's needs."""

    indexes: KvIndexes
    routing: KvRouting


class Router:
    """One router process: its fleet, its discovery sources, its servers."""

    def __init__(
        self,
        settings: Settings,
        fleet: Fleet,
        sources: Sequence[DiscoverySource],
        kv: KvWiring | None = None,
        engine_tls: EngineTls | None = None,
        picker_tls: grpc.ServerCredentials | None = None,
    ) -> None:
        """`kv`: the indexes and tokenizer of `--routing kv-aware` (`build_kv_wiring`).
        `engine_tls`: the context for https engines (`serve` builds it off the event loop);
        None: built here from `settings.engine_tls`. `picker_tls`: the endpoint picker's TLS
        (likewise; None: built here when `--ext-proc-tls-cert` asks for it)."""
        self.settings = settings
        self.fleet = fleet
        self.sources = list(sources)
        self.kv = kv
        kv_views = None if kv is None else kv.indexes.views
        self.placement = None if kv is None else kv.routing.placement
        statuses = [source.status for source in self.sources]
        self.metrics = Metrics(lambda: fleet.snapshot, statuses, kv_views=kv_views)
        self.auth = Authentication(settings.auth)
        credentials = self.auth.credentials
        # one lookup policy for probes and proxy
        resolver = Resolver(settings.dns.timeout, pinned_first(settings.dns.pinned))
        # one TLS context for probes, proxy and /tokenize
        tls = engine_tls or build_engine_tls(settings.engine_tls)
        self.prober = Prober(
            self.fleet,
            settings.probe,
            headers=credentials.engine_probe_headers,
            resolver=resolver,
            tls=tls,
        )
        self.flow = _flow_control(settings, fleet, credentials, self.metrics)
        self.supervisor = Supervisor(settings.supervision, self.metrics.task_restarts)
        self.shutting_down = False
        self._source_tasks: dict[str, asyncio.Task[None]] = {}
        self.admin = AdminApp(
            self.fleet,
            self.metrics,
            statuses,
            settings.health,
            dead_sources=self._dead_sources,
            shutting_down=lambda: self.shutting_down,
            local_problems=self._local_problems,
            kv_views=kv_views,
            kv_placement=None if self.placement is None else self.placement.status,
            admin_port=settings.server.admin_port,
        )
        self.health_watch = HealthWatch(self.admin.report, fleet)
        self.proxy = Proxy(
            self.fleet,
            _policy(settings, kv),
            settings.proxy,
            self.metrics,
            self.admin.handle if settings.server.admin_port is None else self.admin.handle_api,
            credentials,
            resolver=resolver,
            flow=self.flow,
            engine_tls=tls,
        )
        self.picker = build_picker(
            settings.server, self.proxy, self.admin.report, picker_tls, self.supervisor.run
        )

    def _local_problems(self) -> list[str]:
        """The router's own troubles for `/health`: resources it ran out of, and a limits
        store that does not answer."""
        problems = list(self.proxy.resources.problems())
        if self.flow is not None:
            store = self.flow.store.health
            if not store.ok:
                problems.append(
                    f"limits store {store.name}: {store.reason}; requests are admitted "
                    "without their limits judged (fail-open)"
                )
        return problems

    def _dead_sources(self) -> set[str]:
        return {name for name, task in self._source_tasks.items() if task.done()}

    async def run(self, stop: asyncio.Event, hurry: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set, then drain and return; `hurry` set cuts the drain short."""
        server_settings = self.settings.server
        await self.auth.load()
        server = None
        if server_settings.port is not None:
            try:
                server = await start_server(self.proxy, server_settings.host, server_settings.port)
            except OSError as exc:
                await self._close_unstarted_sources()
                raise ConfigError(
                    f"cannot listen on {server_settings.host}:{server_settings.port}: "
                    f"{exc.strerror or exc}"
                ) from None
        admin_port = server_settings.admin_port
        if admin_port is not None:
            try:
                await start_local_server(
                    self.proxy, self.admin.handle_admin, server_settings.host, admin_port
                )
            except OSError as exc:
                if server is not None:
                    server.close()
                await self._close_unstarted_sources()
                raise ConfigError(f"--admin-port {admin_port}: {exc.strerror or exc}") from None
            log.info("admin endpoints on http://%s:%d", server_settings.host, admin_port)
        watching = self.supervisor.run("key-files", self.auth.run) if self.auth.files else None
        key_files = asyncio.create_task(watching or self.auth.run(), name="key files")
        for source in self.sources:
            task = asyncio.create_task(source.run(), name=source.status.name)
            task.add_done_callback(self._on_source_done)
            self._source_tasks[source.status.name] = task
        prober = asyncio.create_task(self.supervisor.run("prober", self.prober.run), name="prober")
        watch = self.supervisor.run("health", self.health_watch.run)
        health_watch = asyncio.create_task(watch, name="health")
        grpc_health = None
        if server_settings.grpc_health_port is not None:
            grpc_health = GrpcHealthServer(
                self.admin.report,
                host=server_settings.host,
                port=server_settings.grpc_health_port,
                supervise=self.supervisor.run,
            )
        log.info(
            "headcount listening on %s (discovery %s, routing %s, data plane %s)",
            "no port of its own (--port off)"
            if server_settings.port is None
            else f"http://{server_settings.host}:{server_settings.port}",
            self.settings.discovery.mode.value,
            self.settings.proxy.routing.value,
            data_plane(),
        )
        stale = stale_compiled()
        if stale:
            log.warning(
                "compiled modules older than their sources run instead of them (%s): "
                "run `make install` to rebuild",
                ", ".join(stale),
            )
        try:
            if self.kv is not None:
                self.kv.indexes.start()
                if self.placement is not None:
                    self.placement.start(self.fleet, self.kv.indexes.usable)
            if grpc_health is not None:
                try:
                    port = await grpc_health.start()
                except OSError as exc:
                    raise ConfigError(
                        f"--grpc-health-port {server_settings.grpc_health_port}: {exc}"
                    ) from None
                log.info("gRPC health (grpc.health.v1) on %s:%d", server_settings.host, port)
            if self.picker is not None:
                try:
                    await self.picker.start()
                except OSError as exc:
                    flag = f"--ext-proc-port {server_settings.ext_proc_port}"
                    raise ConfigError(f"{flag}: {exc}") from None
            await stop.wait()
            await self._drain_unless_hurried(server, hurry or asyncio.Event())
        finally:
            if server is not None:
                server.close()
            if self.picker is not None:
                await self.picker.stop(0)
            if grpc_health is not None:
                await grpc_health.stop()
            others = (prober, key_files, health_watch)
            for task in (*self._source_tasks.values(), *others):
                task.cancel()
            await asyncio.gather(*self._source_tasks.values(), *others, return_exceptions=True)
            await self.proxy.close()
            if self.flow is not None:
                await self.flow.close()
            if self.placement is not None:
                await self.placement.close()
            if self.kv is not None:
                await self.kv.indexes.close()

    async def _close_unstarted_sources(self) -> None:
        """Sources that hold a connection pool (an API client) release it when `run()` ends;
        when the router cannot start, `run()` never began, so they are closed here."""
        for source in self.sources:
            close = getattr(source, "close", None)
            if close is not None:
                await close()

    async def _drain_unless_hurried(
        self, server: ClientListener | None, hurry: asyncio.Event
    ) -> None:
        drain = asyncio.ensure_future(self._drain(server))
        hurried = asyncio.ensure_future(hurry.wait())
        try:
            await asyncio.wait((drain, hurried), return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurried.cancel()
        if not drain.done():
            log.warning("asked again to stop: closing %d requests now", self.proxy.in_flight)
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)

    async def _drain(self, server: ClientListener | None) -> None:
        health = self.settings.health
        self.shutting_down = True
        log.info(
            "shutting down: not ready; serving new requests for %gs, then draining",
            health.drain_delay,
        )
        await asyncio.sleep(health.drain_delay)
        if server is not None:
            server.close()
        self.proxy.begin_drain()
        picker = self.picker
        stopped = asyncio.sleep(0) if picker is None else picker.stop(health.drain_timeout)
        # streams through the picker get the same time to end as the router's own requests
        idle, _ = await asyncio.gather(self.proxy.wait_idle(health.drain_timeout), stopped)
        if idle:
            log.info("drained: no request in flight")
        else:
            log.warning(
                "drain timeout %gs: closing %d requests", health.drain_timeout, self.proxy.in_flight
            )

    def _on_source_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        log.error(
            "discovery loop %s stopped (%s): /livez now fails so the pod is restarted",
            task.get_name(),
            repr(error) if error else "returned",
            exc_info=error,
        )


def _flow_control(
    settings: Settings, fleet: Fleet, credentials: Credentials, metrics: Metrics
) -> FlowControl | None:
    """Flow control, with a tenants file: its limits' store, its series."""
    if settings.auth.tenants_file is None:
        return None
    flow = settings.flow
    store: LimitsStore = (
        MemoryStore()
        if flow.limits_store is None
        else RedisStore(flow.limits_store, flow.limits_store_timeout)
    )
    control = FlowControl(fleet, flow, store, lambda: credentials.tenants)
    metrics.scrape_also(
        lambda snapshot: FlowCollector(
            control.tallies.counts((credentials.tenants or Tenants()).names),
            control.depths(),
            snapshot,
            control.store.health,
        )
    )
    return control


def _policy(settings: Settings, kv: KvWiring | None) -> Policy:
    proxy = settings.proxy
    routing = None if kv is None else kv.routing
    return make_policy(proxy.routing, affinity_epsilon=proxy.affinity_epsilon, kv=routing)


async def load_router_tokenizer(
    setting: str | None, cache_bytes: int = KvEventsSettings.tokenizer_cache_size
) -> ChatTokenizer | None:
    """`--tokenizer`: None (ask the engines), the built-in one, or a directory's, read off the
    event loop, keeping `cache_bytes` of encoded text; a directory that cannot be loaded is a
    `ConfigError` in one line."""
    if setting is None:
        return None
    if setting == BUILTIN_TOKENIZER:
        return builtin_tokenizer(cache_bytes)
    try:
        return await asyncio.to_thread(load_tokenizer, setting, cache_bytes)
    except TokenizerError as exc:
        raise ConfigError(f"--tokenizer {setting}: {exc}") from None


async def build_kv_wiring(
    settings: KvEventsSettings, fleet: Fleet, *, clock: Callable[[], float] = time.monotonic
) -> KvWiring:
    """The indexes and tokenizer of `--routing kv-aware`; the index modules (and pyzmq) are
    imported only then."""
    from headcount.kvindex.registry import KvIndexes
    from headcount.kvindex.subscriber import EventSubscriber

    tokenizer = await load_router_tokenizer(settings.tokenizer, settings.tokenizer_cache_size)
    indexes = KvIndexes(
        fleet,
        subscriber=functools.partial(
            EventSubscriber,
            max_frame=settings.max_frame,
            budget=settings.budget,
            check_interval=settings.check_interval,
        ),
        port=settings.port,
        replay_port=settings.replay_port,
        topic=settings.topic,
        idle_timeout=settings.idle_timeout,
        replay_timeout=settings.replay_timeout,
        clock=clock,
        max_bytes=settings.index_max_bytes,
        max_bytes_per_engine=settings.index_max_bytes_per_engine,
    )
    log.info(
        "kv-aware: KV events from engine ports %d (replay %d), tokens from %s",
        settings.port,
        settings.replay_port,
        "each engine's /tokenize" if tokenizer is None else f"tokenizer {tokenizer.name}",
    )
    placement = Placement(clock=clock) if settings.placement else None
    routing = KvRouting(indexes, tokenizer, settings.tokenize_timeout, placement=placement)
    return KvWiring(indexes, routing)


async def build_sources(settings: Settings, fleet: Fleet) -> list[DiscoverySource]:
    """The discovery sources `settings` ask for (loading the kubeconfig for Kubernetes modes)."""
    if settings.discovery.mode is DiscoveryMode.STATIC:
        return [StaticSource(fleet, settings.discovery.backends)]
    from headcount.discovery.build import build_k8s_source

    return [await build_k8s_source(settings.discovery, fleet)]


async def serve(settings: Settings) -> None:
    """Run a router until SIGTERM or SIGINT; a second signal skips what is left of the drain."""
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    raise_open_file_limit()
    if not release_large_allocations():
        log.info("large allocations stay with the C library's default (not glibc)")
    fleet = Fleet(unhealthy_after=settings.probe.unhealthy_after, outliers=settings.outlier)
    kv = None
    if settings.proxy.routing is RoutingName.KV_AWARE:
        kv = await build_kv_wiring(settings.kv_events, fleet)
    tls = await asyncio.to_thread(build_engine_tls, settings.engine_tls)
    cert, key = settings.server.ext_proc_tls_cert, settings.server.ext_proc_tls_key
    picker_tls = None
    if cert is not None and key is not None:
        picker_tls = await asyncio.to_thread(picker_credentials, cert, key)
    sources = await build_sources(settings, fleet)
    router = Router(settings, fleet, sources, kv, tls, picker_tls)
    loop.add_signal_handler(signal.SIGHUP, router.auth.reload_soon)
    gc.freeze()
    await router.run(stop, hurry)
