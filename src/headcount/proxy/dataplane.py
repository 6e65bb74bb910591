"""The data plane: accept clients, proxy inference requests, answer the rest locally.

    proxy = Proxy(fleet, policy, settings.proxy, metrics, admin.handle_api, auth.credentials)
    server = await start_server(proxy, "0.0.0.0", 8080)
    await start_local_server(proxy, admin.handle_admin, "0.0.0.0", 9090)  # --admin-port
    ...
    proxy.begin_drain()                  # stop accepting, close idle keep-alive connections
    await proxy.wait_idle(timeout=30)    # in-flight exchanges finish
    await proxy.close()                  # drop what is left, close upstream pools

`POST /v1/chat/completions` and the other endpoints vLLM serves (`paths.py`)
are proxied: `Admission.admit` picks the engine (or the error to answer), and
an `Exchange` carries the request to its end (a stored response's `GET` and
cancel go to its engine: `Admission.stored`). When admission must wait first (a large body
read by a worker process, an engine's `/tokenize` for the `kv-aware` policy),
it says only what to await (`Later`): the data plane awaits it in a task that
the client's leaving cancels, so that no request stalls the loop and a client
that left waits for nothing. Every other request goes to the `LocalHandler`
(`/v1/models`, `/engines`, health, metrics), none of which is hot. Clients are
accepted by `_http/acceptor.py` on both listeners: running out of descriptors
is counted in `resources`, never blamed on an engine.

With client keys (`Credentials.client_keys`), every request but the health
endpoints (`/livez`, `/readyz`, `/health`: kubelet probes carry no key) needs
`Authorization: Bearer <key>`, else 401 with `www-authenticate: Bearer`.
`start_local_server` opens a second listener (the admin port) that serves only
a `LocalHandler`, with no key; it stays open through the drain, so probes and
scrapes are answered until the process ends.

The key and the route are judged from the request's head (`Proxy.screen`),
before any of its body is read: only a proxied `POST` with a key (when keys
are configured) has its body read and counted in the body budget. Every other
request, refused or answered locally (none of those answers needs a body), is
answered from its head, its body never read (the connection closes after the
answer when it has one). The admin port answers every request from its head:
neither a client without a key nor the admin port can take what keyed
requests need.

Per engine, the proxy keeps the exchanges waiting for its first byte and
those streaming from it: when it leaves rotation or the fleet, they fail over
or resume elsewhere at once (`Exchange.engine_left`), not after `--read-timeout`.

The request goes out with hop-by-hop headers dropped, `host` set to the engine,
the engine key in place of the client's `Authorization` when keys are
configured, and an `x-request-id` (the client's, or a new one), which also
comes back on the response (`headers.py`). The answer streams back as it
arrives, one client write per upstream read.

Errors are OpenAI-shaped JSON (`errors.py`): 401 no or wrong key, 400 bad JSON
or no `model`, 404 unknown model, 413 body too large, 503 no routable engine
(or, from the HTTP layer, too many connections or request bodies held), 502/504
after failover, 500 for a bug in the router (logged once; no stack trace
reaches a client).

(Over 450 lines: the one place every request is dispatched, screened by its
head, proxied, sent to a stored response's engine, refused or answered
locally, beside the lifecycle that drains that dispatch; split, each half
would reach into the other's state.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections.abc import Awaitable

from headcount._http.acceptor import ClientListener, listen
from headcount._http.connections import ConnectionRegistry
from headcount._http.handler import Request, RequestHandler, Responder
from headcount._http.local import LocalHandler, TaskExchange, serve_local
from headcount._http.pool import Dial, PoolOptions, Upstreams
from headcount._http.resolve import Resolver
from headcount._http.resources import LocalResources
from headcount._http.server import HttpServerProtocol, ServerLimits
from headcount._http.tls import EngineTls
from headcount._http.wire import INTERNAL_ERROR_BODY, JSON_HEADER, method_not_allowed_body
from headcount.auth import Credentials
from headcount.auth.keys import bearer_token
from headcount.config import DnsSettings, ProxySettings
from headcount.fleet import Fleet, FleetChange
from headcount.flow.control import FlowControl
from headcount.proxy.admission import Admission, Admitted, Later, Refused
from headcount.proxy.errors import INVALID_API_KEY, MISSING_API_KEY, ErrorAnswer
from headcount.proxy.exchange import Exchange, ExchangeContext
from headcount.proxy.headers import find_header, forward_headers
from headcount.proxy.paths import API_PREFIX, PROXIED, RESPONSES, passes_through
from headcount.proxy.rejections import LayerRejections, refusal_entry
from headcount.proxy.stalls import StallWatch
from headcount.proxy.stored_responses import StoredResponses, response_id_of
from headcount.routing import Policy
from headcount.surfaces.access_log import AccessLog
from headcount.surfaces.metrics import UNKNOWN_MODEL, Metrics, whole

__all__ = ["Proxy", "key_refusal", "method_refusal", "start_local_server", "start_server"]

_log = logging.getLogger(__name__)

_OPEN_PATHS = frozenset({b"/livez", b"/readyz", b"/health"})
_OPEN_PREFIXES = (b"/livez/", b"/readyz/")
"""The health endpoints: kubelet probes carry no key."""
_UNAUTHORIZED_HEADERS = JSON_HEADER + b"www-authenticate: Bearer\r\n"
_POST_ONLY_HEADERS = JSON_HEADER + b"allow: POST\r\n"
_MISSING_KEY = Refused(MISSING_API_KEY, UNKNOWN_MODEL, _UNAUTHORIZED_HEADERS)
_INVALID_KEY = Refused(INVALID_API_KEY, UNKNOWN_MODEL, _UNAUTHORIZED_HEADERS)


class Proxy:
    """The data plane's lifecycle and dispatch; see the module docstring."""

    def __init__(
        self,
        fleet: Fleet,
        policy: Policy,
        settings: ProxySettings,
        metrics: Metrics,
        local: LocalHandler,
        credentials: Credentials | None = None,
        *,
        resolver: Resolver | None = None,
        dial: Dial | None = None,
        resources: LocalResources | None = None,
        flow: FlowControl | None = None,
        engine_tls: EngineTls | None = None,
    ) -> None:
        """`credentials` None: no key needed, the client's `Authorization` passes through.
        `resolver` looks engine host names up (shared with the probes; default: a fresh one
        with the default `DnsSettings`), `dial` opens plain engine connections (tests inject
        here), `engine_tls` https ones (None: none can be). `resources` hears of the router's
        own resources running out (None: one counting into `metrics` and seeing what they
        count). `flow`: flow control (a tenants file), None off."""
        self.fleet = fleet
        self.policy = policy
        self.metrics = metrics
        if resources is None:
            resources = LocalResources(count=metrics.local_resource_error)
            metrics.watch_local_resources(resources.seen)
        self.resources = resources
        self._local = local
        self._credentials = credentials or Credentials()
        self.limits = ServerLimits(
            max_header_size=settings.max_header_size,
            max_body_size=settings.max_body_size,
            keepalive_timeout=settings.client_idle_timeout,
            max_pipeline=settings.max_pipeline,
            header_timeout=settings.client_header_timeout,
            send_timeout=settings.client_send_timeout,
        )
        self.upstreams = Upstreams(
            PoolOptions(
                connect_timeout=settings.connect_timeout,
                read_timeout=settings.read_timeout,
                idle_timeout=settings.pool_idle_timeout,
                max_idle=settings.pool_max_idle,
                max_head_size=settings.max_header_size,
                resolver=resolver or Resolver(DnsSettings().timeout),
                dial=dial,
                tls=engine_tls,
            )
        )
        self.flow = flow
        self._passthrough = settings.passthrough
        self.stored = StoredResponses()  # which engine stores each Responses API response
        metrics.scrape_also(self.stored.collector)
        self._admission = Admission(
            fleet, policy, settings, self.upstreams, self._credentials, flow, self.stored
        )
        self._waiting: dict[str, dict[Exchange, None]] = {}
        self._streaming: dict[str, dict[Exchange, None]] = {}
        self._context = ExchangeContext(
            fleet=fleet,
            policy=policy,
            upstreams=self.upstreams,
            metrics=metrics,
            max_failovers=settings.max_failovers,
            spawn=self._spawn,
            waiting=self._waiting,
            first_byte_timeout=settings.first_byte_timeout,
            access=AccessLog(settings.access_log_sample),
            stalls=StallWatch(settings.stalled_engine_timeout, self._waiting, fleet, metrics)
            if settings.stalled_engine_timeout
            else None,
            resume_limit=settings.stream_resume_limit,
            streaming=self._streaming,
        )
        self._rejections = LayerRejections(metrics, self._context.access, self._new_request_id)
        limit = settings.connection_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self._connections = ConnectionRegistry(
            limit=limit,
            body_budget=settings.max_buffered_body_bytes,
            on_full=lambda: self.resources.exhausted(
                "connections", f"{limit} client connections open (--max-connections)"
            ),
        )
        self._servers: list[ClientListener] = []
        # The admin port's connections: no cap of their own, the same body budget.
        self._local_connections = ConnectionRegistry(body_budget=self._connections.bodies)
        self._local_servers: list[ClientListener] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._id_prefix = os.urandom(6).hex().encode() + b"-"
        self._last_id = 0
        fleet.subscribe(self._on_fleet_change)

    @property
    def in_flight(self) -> int:
        """Client requests received and not yet answered, proxied or local."""
        return self._connections.active

    @property
    def admission(self) -> Admission:
        """The one admission path, shared with the endpoint picker (`gateway/`)."""
        return self._admission

    @property
    def credentials(self) -> Credentials:
        return self._credentials

    @property
    def access(self) -> AccessLog:
        return self._context.access

    @property
    def passthrough(self) -> bool:
        """Whether other `/v1/` POSTs go to engines too (`paths.passes_through`)."""
        return self._passthrough

    def new_request_id(self) -> bytes:
        """A fresh `x-request-id` for a request that came without one."""
        return self._new_request_id()

    @property
    def connections(self) -> ConnectionRegistry:
        """The open client connections, their limit and the request-body bytes they hold."""
        return self._connections

    @property
    def awaiting_first_byte(self) -> int:
        """Proxied requests whose current attempt has no response byte yet."""
        return sum(len(exchanges) for exchanges in self._waiting.values())

    def begin_drain(self) -> None:
        """Stop accepting; close idle client connections, the others after their response."""
        for server in self._servers:
            server.close()
        self._connections.drain()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait for in-flight requests to end; False if some were left after `timeout`."""
        return await self._connections.wait_idle(timeout)

    async def close(self) -> None:
        """Drop every client connection and upstream pool; in-flight requests are abandoned."""
        for server in (*self._servers, *self._local_servers):
            server.close()
        self._connections.close()
        self._local_connections.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # the aborted connections' connection_lost release their upstreams
        self.upstreams.close()
        await self._admission.close()

    # -- wiring -------------------------------------------------------------------------------

    def protocol(self, loop: asyncio.AbstractEventLoop) -> HttpServerProtocol:
        """A protocol for one client connection (the factory `start_server` uses)."""
        self._loop = loop
        return HttpServerProtocol(
            self._forward,
            self.limits,
            self._connections,
            loop,
            self._rejections,
            self.screen,
        )

    def local_protocol(
        self, loop: asyncio.AbstractEventLoop, local: LocalHandler
    ) -> HttpServerProtocol:
        """A protocol for one connection of a listener that only `local` answers, with no key.
        None of its answers needs a body, so every request is answered from its head: no
        request there reads or holds a body."""

        def handle(request: Request, responder: Responder) -> None:
            serve_local(local, request, responder, self._spawn, self._request_id(request))

        def screen(_request: Request) -> RequestHandler:
            return handle

        return HttpServerProtocol(
            handle, self.limits, self._local_connections, loop, self._rejections, screen
        )

    def _attach_server(self, server: ClientListener) -> None:
        self._servers.append(server)

    def _on_fleet_change(self, change: FleetChange) -> None:
        if change.removed or change.left:
            self._engines_left(change)
        if change.removed:
            self.upstreams.drop(change.removed)

    def _engines_left(self, change: FleetChange) -> None:
        """Requests waiting on or streaming from an engine that left go elsewhere now."""
        snapshot = self.fleet.snapshot
        for removed, engine_ids in ((True, change.removed), (False, change.left)):
            for engine_id in engine_ids:
                for held in (self._waiting, self._streaming):
                    exchanges = (held.pop if removed else held.get)(engine_id, None)
                    for exchange in list(exchanges or ()):
                        exchange.engine_left(snapshot, removed)

    def _spawn(self, awaitable: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _new_request_id(self) -> bytes:
        self._last_id += 1  # compiled, `%b` and `%d` build the bytes at once, `%x` is generic
        return b"%b%d" % (self._id_prefix, self._last_id)

    def _request_id(self, request: Request) -> bytes:
        """The client's `x-request-id`, or a new one."""
        return find_header(request.headers, b"x-request-id") or self._new_request_id()

    # -- requests -----------------------------------------------------------------------------

    def screen(self, request: Request) -> RequestHandler | None:
        """The data port's `HeadScreen`, the one place a key is checked: with client keys,
        only requests bearing one (or for a health endpoint) are served. Only a proxied
        `POST` has its body read (then `_forward` gets it whole); every other request is
        answered from its head, so that none holds any of the body budget."""
        keys = self._credentials.client_keys
        path = request.path
        if path in PROXIED or (self._passthrough and passes_through(path, request.method)):
            if keys is not None:
                tenant = keys.tenant(request.headers, request.note)
                if tenant is None:
                    return self._unauthorized
                request.identity = tenant  # flow control needs no second look at the key
            return None if request.method == b"POST" else self._wrong_method
        if (
            keys is None
            or path in _OPEN_PATHS
            or path.startswith(_OPEN_PREFIXES)
            or keys.admits(request.headers, request.note)
        ):
            if path.startswith(API_PREFIX) and response_id_of(path, request.method):
                return self._forward_stored
            return self._serve_local
        return self._unauthorized

    def _forward_stored(self, request: Request, responder: Responder) -> None:
        """A stored response's `GET` or cancel, answered from its head, to its engine."""
        loop = self._loop or asyncio.get_running_loop()
        response_id = response_id_of(request.path, request.method) or ""
        decision = self._admission.stored(response_id)
        self._proceed(request, responder, decision, loop, loop.time())

    def _serve_local(self, request: Request, responder: Responder) -> None:
        serve_local(self._local, request, responder, self._spawn, self._request_id(request))

    def _forward(self, request: Request, responder: Responder) -> None:
        loop = self._loop or asyncio.get_running_loop()
        started = loop.time()
        decision = self._admission.admit(request)
        if isinstance(decision, Later):
            self._forward_later(request, responder, decision.decision, loop, started)
        else:
            self._proceed(request, responder, decision, loop, started)

    def _forward_later(
        self,
        request: Request,
        responder: Responder,
        decision: Awaitable[Admitted | Refused],
        loop: asyncio.AbstractEventLoop,
        started: float,
    ) -> None:
        """Route once `decision` is made, in a task the client's leaving cancels."""

        async def forward() -> None:
            try:
                self._proceed(request, responder, await decision, loop, started)
            except Exception:
                _log.exception("routing a request after waiting for its admission failed")
                responder.respond(500, JSON_HEADER, INTERNAL_ERROR_BODY)

        responder.attach(TaskExchange(self._spawn(forward())))

    def _proceed(
        self,
        request: Request,
        responder: Responder,
        decision: Admitted | Refused,
        loop: asyncio.AbstractEventLoop,
        started: float,
    ) -> None:
        if isinstance(decision, Refused):
            self._refuse(request, responder, decision, started)
            return
        line = b"%s %s HTTP/1.1\r\n" % (request.method, request.target)
        authorization = self._credentials.forward_authorization
        body = request.body if decision.body is None else decision.body
        tail, request_id = forward_headers(request.headers, len(body), authorization)
        if request_id is None:
            request_id = self._new_request_id()
            tail = b"x-request-id: %s\r\n%s" % (request_id, tail)
        wire = (line, tail, body)
        exchange = Exchange(
            self._context,
            responder,
            loop,
            decision.features,
            started,
            request_id,
            wire,
            request.path,
            decision.ticket,
            request.identity,
            stored=self.stored if request.path == RESPONSES else None,
        )
        responder.attach(exchange)
        exchange.begin(decision.engine)

    def _wrong_method(self, request: Request, responder: Responder) -> None:
        refused = method_refusal(request)
        loop = self._loop or asyncio.get_running_loop()
        self._refuse(request, responder, refused, loop.time())

    def _unauthorized(self, request: Request, responder: Responder) -> None:
        refused = key_refusal(request.headers)
        loop = self._loop or asyncio.get_running_loop()
        self._refuse(request, responder, refused, loop.time())

    def _refuse(
        self,
        request: Request,
        responder: Responder,
        refused: Refused,
        started: float,
    ) -> None:
        status, body = refused.answer
        request_id = self._request_id(request)
        responder.respond(status, refused.headers + b"x-request-id: %s\r\n" % request_id, body)
        loop = self._loop or asyncio.get_running_loop()
        duration, outcome = loop.time() - started, whole(status)
        self.metrics.request_done(refused.label, status, outcome, duration, None)
        access = self._context.access
        if access.wants(True):  # no refusal is a 2xx
            model = refused.model or refused.label
            access.write(refusal_entry(request, request_id, model, status, duration, len(body)))


def method_refusal(request: Request) -> Refused:
    """The 405 for a request to a proxied path that is no `POST`."""
    method, path = request.method.decode("latin-1"), request.path.decode("latin-1")
    return Refused(
        ErrorAnswer(405, method_not_allowed_body(method, path, "POST")),
        UNKNOWN_MODEL,
        _POST_ONLY_HEADERS,
    )


def key_refusal(headers: list[tuple[bytes, bytes]]) -> Refused:
    """The 401 for a request with no key, or with none of ours."""
    return _MISSING_KEY if bearer_token(headers) is None else _INVALID_KEY


async def start_server(
    proxy: Proxy, host: str, port: int, *, reuse_port: bool = False, backlog: int = 2048
) -> ClientListener:
    """Listen for clients; `reuse_port` lets several worker processes share the port."""
    loop = asyncio.get_running_loop()
    server = await listen(
        host,
        port,
        lambda: proxy.protocol(loop),
        proxy.resources,
        reuse_port=reuse_port,
        backlog=backlog,
    )
    proxy._attach_server(server)
    return server


async def start_local_server(
    proxy: Proxy, local: LocalHandler, host: str, port: int
) -> ClientListener:
    """Listen for requests only `local` answers, with no key (the admin port); closed by
    `proxy.close()`, not by the drain."""
    loop = asyncio.get_running_loop()
    server = await listen(host, port, lambda: proxy.local_protocol(loop, local), proxy.resources)
    proxy._local_servers.append(server)
    return server
