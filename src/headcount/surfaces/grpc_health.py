"""The standard `grpc.health.v1.Health` service, for platforms that probe the router with gRPC.

Service `liveness` answers like `/livez`; `readiness` and `""` (the whole
server) answer like `/readyz`; any other name is NOT_FOUND for `Check` and
SERVICE_UNKNOWN for `Watch`, as the standard says. Health changes with time
alone (discovery goes stale without any event), so every `Check` and `List`
judges a fresh report, and a refresh task re-judges every `refresh_interval`
seconds so that `Watch` streams see each change. When the server stops, every
service turns NOT_SERVING and the watch streams end.

`GrpcHealth` is the service itself, added to any grpc.aio server (the endpoint
picker's, where the ext_proc service's own name answers like `readiness` too);
`GrpcHealthServer` is a server on its own port holding only it.

    server = GrpcHealthServer(admin.report, host="0.0.0.0", port=9090)
    await server.start()
    ...
    await server.stop()

    health = GrpcHealth(admin.report, ready_services=(EXT_PROC_SERVICE,))
    health.add_to(grpc_server)
    health.start()
    ...
    await health.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headcount.surfaces.health import HealthReport

__all__ = ["GrpcHealth", "GrpcHealthServer", "grpc_address", "start_grpc"]

_log = logging.getLogger("headcount.grpc_health")

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

Verdict = Callable[[HealthReport], bool]

_SERVICES: Mapping[str, Verdict] = {
    "": lambda report: report.is_ready,
    "liveness": lambda report: report.is_live,
    "readiness": lambda report: report.is_ready,
}
"""Each service name and the verdict it reports."""

_SERVER_OPTIONS = [("grpc.so_reuseport", 0)]
"""gRPC sets SO_REUSEPORT by default: a second router would share the port instead of failing."""


class _HealthServicer:
    """Check, List and Watch over one published set of statuses, re-judged on every refresh."""

    def __init__(self, report: Callable[[], HealthReport], services: Mapping[str, Verdict]) -> None:
        self._report = report
        self._services = services
        self._closed = False
        self._changed = asyncio.Event()
        self._statuses: dict[str, int] = {}

    def refresh(self) -> Mapping[str, int]:
        """Judge a fresh report and publish it, waking the watchers if anything changed."""
        statuses = self._judge()
        if statuses != self._statuses:
            self._statuses = statuses
            self._changed.set()
            self._changed = asyncio.Event()
        return statuses

    def close(self) -> None:
        """Turn every service NOT_SERVING for good and let the watch streams end."""
        self._closed = True
        self.refresh()
        self._changed.set()

    def _judge(self) -> dict[str, int]:
        if self._closed:
            return dict.fromkeys(self._services, _NOT_SERVING)
        try:
            report = self._report()
        except Exception:
            _log.exception("health report failed: every gRPC health service is NOT_SERVING")
            return dict.fromkeys(self._services, _NOT_SERVING)
        return {
            service: _SERVING if verdict(report) else _NOT_SERVING
            for service, verdict in self._services.items()
        }

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        status = self.refresh().get(request.service)
        if status is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"unknown service {request.service!r}; "
                f"known: {', '.join(map(repr, self._services))}",
            )
        return health_pb2.HealthCheckResponse(status=status)

    async def List(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        statuses = self.refresh()
        return health_pb2.HealthListResponse(
            statuses={
                service: health_pb2.HealthCheckResponse(status=status)
                for service, status in statuses.items()
            }
        )

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        self.refresh()
        sent: int | None = None
        while True:
            # Taken before reading, so a change published while we write is not missed.
            changed = self._changed
            status = self._statuses.get(request.service, _SERVICE_UNKNOWN)
            if status != sent:
                yield health_pb2.HealthCheckResponse(status=status)
                sent = status
            if self._closed:
                return
            await changed.wait()


Supervise = Callable[[str, Callable[[], Awaitable[None]]], Coroutine[Any, Any, None]]
"""`Supervisor.run`: the refresher restarted if it ever crashes."""


class GrpcHealth:
    """The health service, added to a grpc.aio server, with the refresher that re-judges it."""

    def __init__(
        self,
        report: Callable[[], HealthReport],
        *,
        ready_services: Sequence[str] = (),
        refresh_interval: float = 1.0,
        supervise: Supervise | None = None,
    ) -> None:
        """`ready_services`: more names that answer like `readiness`."""
        if refresh_interval <= 0:
            raise ValueError(f"refresh_interval must be positive, got {refresh_interval!r}")
        services = dict(_SERVICES)
        for name in ready_services:
            services[name] = _SERVICES["readiness"]
        self._servicer = _HealthServicer(report, services)
        self._refresh_interval = refresh_interval
        self._refresher: asyncio.Task[None] | None = None
        self._supervise = supervise

    def add_to(self, server: grpc.aio.Server) -> None:
        """Serve the health service on `server` (before it starts)."""
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)

    def start(self) -> None:
        """Re-judge health every `refresh_interval` seconds, so that watchers see changes."""
        refresher = (
            self._supervise("grpc-health-refresh", self._refresh_forever)
            if self._supervise is not None
            else self._refresh_forever()
        )
        self._refresher = asyncio.create_task(refresher, name="grpc health refresh")

    async def stop(self) -> None:
        """Report NOT_SERVING to the watchers and end their streams; stop refreshing."""
        self._servicer.close()
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval)
            self._servicer.refresh()


class GrpcHealthServer:
    """A gRPC server on its own port holding only the health service, on the running loop."""

    def __init__(
        self,
        report: Callable[[], HealthReport],
        *,
        host: str,
        port: int,
        refresh_interval: float = 1.0,
        supervise: Supervise | None = None,
    ) -> None:
        self._health = GrpcHealth(report, refresh_interval=refresh_interval, supervise=supervise)
        self._address = grpc_address(host, port)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Listen and start refreshing; returns the bound port. Raises OSError if it cannot bind."""
        server, port = await start_grpc(self._address, self._health.add_to)
        self._server = server
        self._health.start()
        _log.info("gRPC health listening on %s (bound port %d)", self._address, port)
        return port

    async def stop(self, grace: float = 1.0) -> None:
        """Report NOT_SERVING to the watchers, end their streams, then close within `grace` s."""
        await self._health.stop()
        if self._server is not None:
            await self._server.stop(grace)


async def start_grpc(
    address: str,
    add_services: Callable[[grpc.aio.Server], None],
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, int]:
    """A gRPC server on the running loop holding the services `add_services` puts on it,
    listening on `address` (TLS with `credentials`, else h2c): the server and its bound
    port. OSError when it cannot bind."""
    # Built here, inside the running loop (asyncio or uvloop): grpc.aio binds to it.
    server = grpc.aio.server(options=_SERVER_OPTIONS)
    add_services(server)
    try:
        if credentials is None:
            port: int = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address}: {exc}") from exc
    await server.start()
    return server, port


def grpc_address(host: str, port: int) -> str:
    """`host:port` as gRPC binds it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
