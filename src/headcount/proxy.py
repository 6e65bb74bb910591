"""Forwarding: send each inference request to an engine, stream the answer back, fail over early.

    proxy = Proxy(fleet, policy, settings.proxy, metrics, local=admin.handle)
    server = await start_server(proxy, "0.0.0.0", 8080)
    ...
    proxy.begin_drain()                  # stop accepting, close idle keep-alive connections
    await proxy.wait_idle(timeout=30)    # in-flight exchanges finish
    await proxy.close()                  # drop what is left, close upstream pools

`POST /v1/chat/completions`, `/v1/completions` and `/v1/embeddings` are proxied;
every other request goes to the `LocalHandler` (`/v1/models`, `/engines`,
health, metrics), none of which is hot.

A proxied request's JSON body is parsed once, to read `model`; the body is
forwarded byte for byte. The policy picks among `snapshot.candidates(model)`;
the request goes out with hop-by-hop headers dropped, `host` set to the engine
and an `x-request-id` (the client's, or a new one), which also comes back on
the response. The answer streams back as it arrives, one client write per
upstream read.

Failure before the first response byte is retried on a different engine, at
most `max_failovers` times: a connect failure (also ejects the engine until a
probe revives it), a connection closed before any byte, or a 502/503 from the
engine. A stale pooled connection is retried once on a fresh connection to the
same engine, not counted as a failover. After the first byte nothing is
retried; a broken stream closes the client connection, its chunked body left
unterminated. Every attempt holds `engine.load.in_flight` from routing to its
end, released at a single point (`_Exchange._release`).

Errors are OpenAI-shaped JSON: 400 bad JSON or no `model`, 404 unknown model,
413 body too large, 503 no routable engine, 502/504 after failover, 500 for a
bug in the router (logged once; no stack trace reaches a client).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from headcount._http.errors import (
    ConnectFailed,
    NoResponse,
    StaleConnection,
    UpstreamError,
    UpstreamTimeout,
)
from headcount._http.server import (
    ConnectionRegistry,
    HttpServerProtocol,
    Request,
    Responder,
    ServerLimits,
)
from headcount._http.upstream import ResponseHead, UpstreamConnection, UpstreamPool, Upstreams
from headcount._http.wire import HOP_BY_HOP, JSON_HEADER, connection_tokens, error_body
from headcount.config import ProxySettings
from headcount.fleet import Engine, Fleet, FleetChange, Snapshot
from headcount.metrics import UNKNOWN_MODEL, Metrics
from headcount.routing import Policy, RequestFeatures

__all__ = ["LocalHandler", "LocalRequest", "LocalResponse", "Proxy", "start_server"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocalRequest:
    """A request the router answers itself; header names lowercased."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class LocalResponse:
    """The answer to a `LocalRequest`; framing and `connection` headers are added for you."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, payload: object) -> LocalResponse:
        return cls(status, json.dumps(payload).encode())


LocalHandler = Callable[[LocalRequest], Awaitable[LocalResponse]]
"""Answers every request that is not proxied (an unknown path included: 404 is its call)."""

_PROXIED = frozenset({b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"})
_REQUEST_DROP = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
_RESPONSE_DROP = HOP_BY_HOP | {b"content-length", b"x-request-id"}
_FAILOVER_STATUSES = frozenset({502, 503})
_FAILOVER_REASONS = {status: f"http_{status}" for status in _FAILOVER_STATUSES}
_CLIENT_CLOSED = 499
"""Recorded in metrics when the client leaves first (nginx's convention); never sent."""
_UNLABELLED = RequestFeatures(UNKNOWN_MODEL)


def _error(status: int, message: str, error_type: str, code: str) -> tuple[int, bytes]:
    return status, error_body(message, error_type, code)


_INVALID_JSON = _error(
    400, "request body is not valid JSON", "invalid_request_error", "invalid_json"
)
_NOT_AN_OBJECT = _error(
    400, "request body must be a JSON object", "invalid_request_error", "invalid_request"
)
_MISSING_MODEL = _error(
    400, "request body must name a `model` (a string)", "invalid_request_error", "missing_model"
)
_NO_ERROR = (0, b"")
_INTERNAL_ERROR = _error(500, "internal error in the router", "internal_error", "internal_error")


class Proxy:
    """The data plane: routes, forwards and fails over; see the module docstring."""

    def __init__(
        self,
        fleet: Fleet,
        policy: Policy,
        settings: ProxySettings,
        metrics: Metrics,
        local: LocalHandler,
        *,
        limits: ServerLimits | None = None,
        pool_idle_timeout: float = 4.0,
        pool_max_idle: int = 256,
    ) -> None:
        """`limits` default to `ServerLimits(max_body_size=settings.max_body_size)`."""
        self.fleet = fleet
        self.policy = policy
        self.settings = settings
        self.metrics = metrics
        self._local = local
        self.limits = limits or ServerLimits(max_body_size=settings.max_body_size)
        self.upstreams = Upstreams(
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            idle_timeout=pool_idle_timeout,
            max_idle=pool_max_idle,
        )
        self._connections = ConnectionRegistry()
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._id_prefix = os.urandom(6).hex().encode() + b"-"
        self._ids = itertools.count(1)
        fleet.subscribe(self._on_fleet_change)

    @property
    def in_flight(self) -> int:
        """Client requests received and not yet answered, proxied or local."""
        return self._connections.active

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
        for server in self._servers:
            server.close()
        self._connections.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # the aborted connections' connection_lost release their upstreams
        self.upstreams.close()

    # -- wiring -------------------------------------------------------------------------------

    def protocol(self, loop: asyncio.AbstractEventLoop) -> HttpServerProtocol:
        """A protocol for one client connection (the factory `start_server` uses)."""
        self._loop = loop
        return HttpServerProtocol(
            self.handle, self.limits, self._connections, loop, self.metrics.rejected
        )

    def _attach_server(self, server: asyncio.Server) -> None:
        self._servers.append(server)

    def _on_fleet_change(self, change: FleetChange) -> None:
        if change.removed:
            self.upstreams.drop(change.removed)

    def _spawn(self, awaitable: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _new_request_id(self) -> bytes:
        return b"%s%x" % (self._id_prefix, next(self._ids))

    # -- requests -----------------------------------------------------------------------------

    def handle(self, request: Request, responder: Responder) -> None:
        """The server's `RequestHandler`: proxy inference requests, hand the rest to `local`."""
        if request.method == b"POST" and request.path in _PROXIED:
            self._forward(request, responder)
        else:
            task = self._spawn(self._serve_local(request, responder))
            responder.attach(_LocalExchange(task))

    def _forward(self, request: Request, responder: Responder) -> None:
        loop = self._loop or asyncio.get_running_loop()
        started = loop.time()
        error, features, engine = self._route(request)
        if engine is None:
            self._reject(request, responder, error, started, features.model)
            return
        line = b"POST %s HTTP/1.1\r\n" % request.target
        tail, request_id = _forward_headers(request.headers, len(request.body))
        if request_id is None:
            request_id = self._new_request_id()
            tail = b"x-request-id: %s\r\n%s" % (request_id, tail)
        wire = (line, tail, request.body)
        exchange = _Exchange(self, responder, loop, features, started, request_id, wire)
        responder.attach(exchange)
        exchange.begin(engine)

    def _route(self, request: Request) -> tuple[tuple[int, bytes], RequestFeatures, Engine | None]:
        """The engine for a request, or the error to answer; features carry the metric label."""
        try:
            payload = json.loads(request.body)
        except ValueError:
            return _INVALID_JSON, _UNLABELLED, None
        if not isinstance(payload, dict):
            return _NOT_AN_OBJECT, _UNLABELLED, None
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            return _MISSING_MODEL, _UNLABELLED, None
        snapshot = self.fleet.snapshot
        candidates = snapshot.candidates(model)
        if not candidates:
            error, label = _unroutable(snapshot, model)
            return error, RequestFeatures(label), None
        key_source = self.policy.key_source
        key = None
        if key_source is not None:
            key = key_source(payload, lambda name: _header(request.headers, name))
        features = RequestFeatures(model, key)
        return _NO_ERROR, features, self.policy.select(candidates, features)

    def _reject(
        self,
        request: Request,
        responder: Responder,
        error: tuple[int, bytes],
        started: float,
        label: str = UNKNOWN_MODEL,
    ) -> None:
        status, body = error
        request_id = _header(request.headers, b"x-request-id") or self._new_request_id()
        responder.respond(status, JSON_HEADER + b"x-request-id: %s\r\n" % request_id, body)
        loop = self._loop or asyncio.get_running_loop()
        self.metrics.request_done(label, status, loop.time() - started, None)

    async def _serve_local(self, request: Request, responder: Responder) -> None:
        try:
            response = await self._local(_local_request(request))
            status, block, body = response.status, _local_headers(response), response.body
        except Exception:
            _log.exception("local handler failed on %r", request.path)
            status, body = _INTERNAL_ERROR
            block = JSON_HEADER
        responder.respond(status, block, body)


async def start_server(
    proxy: Proxy, host: str, port: int, *, reuse_port: bool = False, backlog: int = 2048
) -> asyncio.Server:
    """Listen for clients; `reuse_port` lets several worker processes share the port."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: proxy.protocol(loop), host, port, reuse_port=reuse_port or None, backlog=backlog
    )
    proxy._attach_server(server)
    return server


class _Exchange:
    """One proxied request from routing to its single end: attempts, failover, streaming back.

    It is the upstream connection's `ResponseListener` and the client connection's
    `ExchangeListener`. Every path out goes through `_end`, and every attempt's
    engine counter through `_release`, which forgets the engine it releases.
    """

    __slots__ = (
        "_conn",
        "_done",
        "_engine",
        "_failovers",
        "_features",
        "_head_sent",
        "_loop",
        "_paused",
        "_proxy",
        "_request_id",
        "_responder",
        "_stale_retried",
        "_started",
        "_status",
        "_task",
        "_tried",
        "_ttfb",
        "_wire",
    )

    def __init__(
        self,
        proxy: Proxy,
        responder: Responder,
        loop: asyncio.AbstractEventLoop,
        features: RequestFeatures,
        started: float,
        request_id: bytes,
        wire: tuple[bytes, bytes, bytes],
    ) -> None:
        """`wire`: the request line, headers after `host` (blank line included), the body."""
        self._proxy = proxy
        self._responder = responder
        self._loop = loop
        self._features = features
        self._started = started
        self._request_id = request_id
        self._wire = wire
        self._engine: Engine | None = None
        self._conn: UpstreamConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._tried: list[str] = []
        self._failovers = 0
        self._stale_retried = False
        self._head_sent = False
        self._paused = False
        self._done = False
        self._status = 0
        self._ttfb: float | None = None

    def begin(self, engine: Engine) -> None:
        self._tried.append(engine.id)
        self._attempt(engine, fresh=False)

    # -- attempts -----------------------------------------------------------------------------

    def _attempt(self, engine: Engine, fresh: bool) -> None:
        self._engine = engine
        load = engine.load
        load.in_flight += 1
        load.requests += 1
        pool = self._proxy.upstreams.pool(engine.id, engine.url)
        conn = None if fresh else pool.take()
        if conn is None:
            self._task = self._proxy._spawn(self._open(pool))
        else:
            self._send(conn, pool)

    async def _open(self, pool: UpstreamPool) -> None:
        try:
            conn = await pool.connect()
        except UpstreamError as error:
            self._task = None
            self.on_upstream_error(error)
            return
        except Exception:
            self._task = None
            self._crash()
            return
        self._task = None
        if self._done:
            conn.close()
        else:
            self._send(conn, pool)

    def _send(self, conn: UpstreamConnection, pool: UpstreamPool) -> None:
        self._conn = conn
        line, tail, body = self._wire
        conn.send(b"".join((line, pool.host_header, tail, body)), self)
        if self._paused:
            conn.pause_reading()

    def _next_engine(self) -> Engine | None:
        """Another engine for this request, if failovers remain and one is left untried."""
        if self._failovers >= self._proxy.settings.max_failovers:
            return None
        tried = self._tried
        candidates = self._proxy.fleet.snapshot.candidates(self._features.model)
        remaining = [engine for engine in candidates if engine.id not in tried]
        policy = self._proxy.policy
        engine = policy.select(remaining, self._features) if remaining else None
        if engine is not None:
            self._failovers += 1
            tried.append(engine.id)
        return engine

    def _release(self, failed: bool) -> None:
        """The one place an attempt gives its engine's in-flight slot back."""
        engine = self._engine
        if engine is None:
            return
        self._engine = None
        load = engine.load
        load.in_flight -= 1
        if failed:
            load.failures += 1

    # -- ResponseListener ---------------------------------------------------------------------

    def on_response(self, head: ResponseHead | None, body: bytes, complete: bool) -> None:
        if self._done:
            return
        if complete:
            self._conn = None  # already back in its pool: a pause while writing must not reach it
        try:
            if head is None:
                self._responder.write(body, complete)
            elif self._failed_over(head, complete):
                return
            else:
                self._ttfb = self._loop.time() - self._started
                self._status = head.status
                self._head_sent = True
                block = _response_headers(head.headers, self._request_id)
                self._responder.start(
                    head.status, head.reason, block, head.content_length, body, complete
                )
            if complete:
                self._release(failed=False)
                self._end(self._status)
        except Exception:
            self._crash()

    def _failed_over(self, head: ResponseHead, complete: bool) -> bool:
        """An engine answering 502/503 did no work: try another, if one is left."""
        if head.status not in _FAILOVER_STATUSES:
            return False
        engine = self._next_engine()
        if engine is None:
            return False  # the last engine's answer is the best one the client can get
        conn = self._conn
        self._conn = None
        if conn is not None:  # None when the answer was complete: the connection is pooled
            conn.cancel()
        self._release(failed=True)
        self._proxy.metrics.failover(_FAILOVER_REASONS[head.status])
        self._attempt(engine, fresh=False)
        return True

    def on_upstream_error(self, error: UpstreamError) -> None:
        self._conn = None
        if self._done:
            return
        try:
            self._recover(error)
        except Exception:
            self._crash()

    def _recover(self, error: UpstreamError) -> None:
        engine = self._engine
        if self._head_sent:
            self._release(failed=True)
            self._responder.abort()
            self._end(502)  # the client saw a status already; the metric records the failure
            return
        if engine is None:
            raise RuntimeError("upstream error with no engine attempted")
        if isinstance(error, StaleConnection) and not self._stale_retried:
            self._stale_retried = True
            self._release(failed=False)
            self._attempt(engine, fresh=True)
            return
        self._release(failed=True)
        if isinstance(error, ConnectFailed):
            self._proxy.fleet.eject(engine.id, f"connect failed: {error}")
        if isinstance(error, ConnectFailed | NoResponse):
            retry = self._next_engine()
            if retry is not None:
                self._proxy.metrics.failover(error.reason)
                self._attempt(retry, fresh=False)
                return
        tries = len(self._tried)
        if isinstance(error, UpstreamTimeout):
            message = f"upstream engine timed out ({error}); tried {tries} engine(s)"
            self._fail(_error(504, message, "upstream_error", "upstream_timeout"))
        else:
            message = f"upstream engine failed ({error.reason}: {error}); tried {tries} engine(s)"
            self._fail(_error(502, message, "upstream_error", "upstream_failed"))

    # -- ExchangeListener ---------------------------------------------------------------------

    def client_lost(self) -> None:
        if self._done:
            return
        task = self._task
        if task is not None:
            self._task = None
            task.cancel()
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.cancel()
        self._release(failed=False)
        self._end(_CLIENT_CLOSED)

    def client_paused(self) -> None:
        self._paused = True
        if self._conn is not None:
            self._conn.pause_reading()

    def client_resumed(self) -> None:
        self._paused = False
        if self._conn is not None:
            self._conn.resume_reading()

    # -- endings ------------------------------------------------------------------------------

    def _fail(self, error: tuple[int, bytes]) -> None:
        status, body = error
        self._responder.respond(
            status, JSON_HEADER + b"x-request-id: %s\r\n" % self._request_id, body
        )
        self._end(status)

    def _crash(self) -> None:
        _log.exception("proxying a request for model %r failed", self._features.model)
        if self._done:
            return
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.cancel()
        self._release(failed=False)
        if self._head_sent:
            self._responder.abort()
            self._end(500)
        else:
            self._fail(_INTERNAL_ERROR)

    def _end(self, status: int) -> None:
        self._done = True
        duration = self._loop.time() - self._started
        self._proxy.metrics.request_done(self._features.model, status, duration, self._ttfb)


class _LocalExchange:
    """A local request's link to its client: a client that leaves cancels the handler."""

    __slots__ = ("_task",)

    def __init__(self, task: asyncio.Task[None]) -> None:
        self._task = task

    def client_lost(self) -> None:
        self._task.cancel()

    def client_paused(self) -> None:
        pass

    def client_resumed(self) -> None:
        pass


def _forward_headers(headers: list[tuple[bytes, bytes]], length: int) -> tuple[bytes, bytes | None]:
    """Rendered headers for the engine, framing and blank line included, and the request id."""
    parts: list[bytes] = []
    request_id: bytes | None = None
    for name, value in _end_to_end(headers, _REQUEST_DROP):
        if name == b"x-request-id":
            request_id = value
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"content-length: %d\r\n\r\n" % length)
    return b"".join(parts), request_id


def _response_headers(headers: list[tuple[bytes, bytes]], request_id: bytes) -> bytes:
    """The engine's headers for the client, hop-by-hop and framing dropped, our request id added."""
    parts: list[bytes] = []
    for name, value in _end_to_end(headers, _RESPONSE_DROP):
        parts += (name, b": ", value, b"\r\n")
    parts += (b"x-request-id: ", request_id, b"\r\n")
    return b"".join(parts)


def _end_to_end(
    headers: list[tuple[bytes, bytes]], drop: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """`headers` without `drop`, `proxy-*` and whatever the `connection` header names."""
    kept: list[tuple[bytes, bytes]] = []
    listed: frozenset[bytes] = frozenset()
    for name, value in headers:
        if name in drop or name.startswith(b"proxy-"):
            if name == b"connection":
                listed = connection_tokens(value)
            continue
        kept.append((name, value))
    if listed:
        return [(name, value) for name, value in kept if name not in listed]
    return kept


def _header(headers: list[tuple[bytes, bytes]], wanted: bytes) -> bytes | None:
    for name, value in headers:
        if name == wanted:
            return value
    return None


def _unroutable(snapshot: Snapshot, model: str) -> tuple[tuple[int, bytes], str]:
    """Why no engine takes `model`: 404 if the fleet works and nobody knows it, else 503."""
    if not snapshot.is_known(model):
        if snapshot.routable:
            message = f"The model `{model}` does not exist."
            return _error(404, message, "invalid_request_error", "model_not_found"), UNKNOWN_MODEL
        total = len(snapshot.engines)
        why = f"none of the fleet's {total} engine(s) is ready" if total else "the fleet is empty"
        message = f"no engine available for model `{model}`: {why}"
        return _error(503, message, "service_unavailable", "no_engine_available"), UNKNOWN_MODEL
    serving = [
        engine
        for engine in snapshot.engines
        if model in engine.served or engine.spec.model_label == model
    ]
    states: dict[str, int] = {}
    for engine in serving:
        states[engine.state.value] = states.get(engine.state.value, 0) + 1
    summary = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    message = f"no routable engine serves model `{model}` right now (engines: {summary})"
    return _error(503, message, "service_unavailable", "no_engine_available"), model


def _local_request(request: Request) -> LocalRequest:
    return LocalRequest(
        method=request.method.decode("latin-1"),
        path=request.path.decode("latin-1"),
        query=request.query.decode("latin-1"),
        headers={
            name.decode("latin-1"): value.decode("latin-1") for name, value in request.headers
        },
        body=request.body,
    )


def _local_headers(response: LocalResponse) -> bytes:
    lines = [f"content-type: {response.content_type}\r\n"]
    lines += (f"{name}: {value}\r\n" for name, value in response.headers.items())
    return "".join(lines).encode("latin-1")
