"""The standard `grpc.health.v1.Health` service, for platforms that probe the router with gRPC.

Service `liveness` answers like `/livez`; `readiness` and `""` (the whole
server) answer like `/readyz`; any other name is NOT_FOUND for `Check` and
SERVICE_UNKNOWN for `Watch`, as the standard says. Health changes with time
alone (discovery goes stale without any event), so every `Check` and `List`
judges a fresh report, and a refresh task re-judges every `refresh_interval`
seconds so that `Watch` streams see each change. When the server stops, every
service turns NOT_SERVING and the watch streams end.

    server = GrpcHealthServer(admin.report, host="0.0.0.0", port=9090)
    await server.start()
    ...
    await server.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headcount.surfaces.health import HealthReport

__all__ = ["GrpcHealthServer"]

_log = logging.getLogger("headcount.grpc_health")

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

_SERVICES: Mapping[str, Callable[[HealthReport], bool]] = {
    "": lambda report: report.is_ready,
    "liveness": lambda report: report.is_live,
    "readiness": lambda report: report.is_ready,
}
"""Each service name and the verdict it reports."""

_SERVER_OPTIONS = [("grpc.so_reuseport", 0)]
"""gRPC sets SO_REUSEPORT by default: a second router would share the port instead of failing."""


class _HealthServicer:
    """Check, List and Watch over one published set of statuses, re-judged on every refresh."""

    def __init__(self, report: Callable[[], HealthReport]) -> None:
        self._report = report
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
            return dict.fromkeys(_SERVICES, _NOT_SERVING)
        try:
            report = self._report()
        except Exception:
            _log.exception("health report failed: every gRPC health service is NOT_SERVING")
            return dict.fromkeys(_SERVICES, _NOT_SERVING)
        return {
            service: _SERVING if verdict(report) else _NOT_SERVING
            for service, verdict in _SERVICES.items()
        }

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        status = self.refresh().get(request.service)
        if status is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"unknown service {request.service!r}; known: {', '.join(map(repr, _SERVICES))}",
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


class GrpcHealthServer:
    """A gRPC server on its own port holding only the health service, on the running loop."""

    def __init__(
        self,
        report: Callable[[], HealthReport],
        *,
        host: str,
        port: int,
        refresh_interval: float = 1.0,
        supervise: Callable[[str, Callable[[], Awaitable[None]]], Coroutine[Any, Any, None]]
        | None = None,
    ) -> None:
        """`supervise` runs the refresher (`Supervisor.run`: restarted if it ever crashes)."""
        if refresh_interval <= 0:
            raise ValueError(f"refresh_interval must be positive, got {refresh_interval!r}")
        self._servicer = _HealthServicer(report)
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._refresh_interval = refresh_interval
        self._server: grpc.aio.Server | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._supervise = supervise

    async def start(self) -> int:
        """Listen and start refreshing; returns the bound port. Raises OSError if it cannot bind."""
        # Built here, inside the running loop (asyncio or uvloop): grpc.aio binds to it.
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)
        try:
            port: int = server.add_insecure_port(self._address)
        except RuntimeError as exc:
            raise OSError(f"gRPC health cannot listen on {self._address}: {exc}") from exc
        await server.start()
        self._server = server
        refresher = (
            self._supervise("grpc-health-refresh", self._refresh_forever)
            if self._supervise is not None
            else self._refresh_forever()
        )
        self._refresher = asyncio.create_task(refresher, name="grpc health refresh")
        _log.info("gRPC health listening on %s (bound port %d)", self._address, port)
        return port

    async def stop(self, grace: float = 1.0) -> None:
        """Report NOT_SERVING to the watchers, end their streams, then close within `grace` s."""
        self._servicer.close()
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._server is not None:
            await self._server.stop(grace)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval)
            self._servicer.refresh()
