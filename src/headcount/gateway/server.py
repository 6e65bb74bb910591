"""The endpoint picker's gRPC server: the ext_proc service and the health service, one port.

`--ext-proc-port` serves `envoy.service.ext_proc.v3.ExternalProcessor` (`picker.py`)
over h2c, or TLS with `--ext-proc-tls-cert`/`--ext-proc-tls-key` (read once at
start: a file that cannot be used is a `ConfigError` in one line), and
`grpc.health.v1.Health` with `liveness`, `readiness` and the ext_proc service's
own name (the last two answer like `/readyz`: a picker whose discovery is stale
says so to the gateway). It runs on the router's loop, beside or instead of
(`--port off`) the router's own OpenAI listener.

What the gateway's ext_proc filter needs: `request_header_mode: SEND`, a
request body mode of FULL_DUPLEX_STREAMED or BUFFERED (announced in
`protocol_config`, which Envoy sends), `response_header_mode: SEND`;
`metadata_options.forwarding_namespaces.untyped: [envoy.lb, envoy.lb.subset_hint]`
for the served endpoint and the subset hint to reach the picker; and, for the
picker to skip response bodies it does not need, `allow_mode_override: true`
with a response body mode other than FULL_DUPLEX_STREAMED (Envoy ignores the
override when either body mode is FULL_DUPLEX_STREAMED: the body then comes and
is echoed).

    server = PickerServer(proxy, admin.report, host="0.0.0.0", port=9002)
    port = await server.start()
    ...
    await server.stop(grace=5)
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from pathlib import Path

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

from headcount.config import ConfigError, ServerSettings
from headcount.gateway.picker import Picker
from headcount.proxy import Proxy
from headcount.surfaces.grpc_health import GrpcHealth, Supervise, grpc_address, start_grpc
from headcount.surfaces.health import HealthReport

__all__ = ["EXT_PROC_SERVICE", "PickerServer", "build_picker", "picker_credentials"]

_log = logging.getLogger("headcount.gateway")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


def picker_credentials(cert: Path, key: Path) -> grpc.ServerCredentials:
    """TLS for the picker's port from PEM files; `ConfigError` naming the flag when they
    cannot be used (blocking: reads the files; call it before serving or in a thread)."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        chain, private = cert.read_bytes(), key.read_bytes()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"--ext-proc-tls-cert {cert} / --ext-proc-tls-key {key}: {exc.strerror or exc}"
            if isinstance(exc, OSError)
            else f"--ext-proc-tls-cert {cert} / --ext-proc-tls-key {key}: not a matching PEM "
            f"certificate and key ({exc.reason or exc})"
        ) from None
    return grpc.ssl_server_credentials([(private, chain)])


class PickerServer:
    """The ext_proc and health services on one gRPC port, on the running loop."""

    def __init__(
        self,
        proxy: Proxy,
        report: Callable[[], HealthReport],
        *,
        host: str,
        port: int,
        credentials: grpc.ServerCredentials | None = None,
        fallbacks: int = 0,
        supervise: Supervise | None = None,
    ) -> None:
        """`credentials`: TLS (`picker_credentials`), None h2c. `fallbacks`: endpoints named
        after the one picked."""
        self._picker = Picker(proxy, fallbacks)
        self._health = GrpcHealth(report, ready_services=(EXT_PROC_SERVICE,), supervise=supervise)
        self._address = grpc_address(host, port)
        self._host = host
        self._credentials = credentials
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Listen; the bound port. `OSError` when it cannot bind."""
        server, port = await start_grpc(self._address, self._add_services, self._credentials)
        self._server = server
        self._health.start()
        security = "h2c" if self._credentials is None else "tls"
        _log.info("endpoint picker (ext_proc, %s) on %s:%d", security, self._host, port)
        return port

    def _add_services(self, server: grpc.aio.Server) -> None:
        external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(self._picker, server)
        self._health.add_to(server)

    async def stop(self, grace: float) -> None:
        """Health NOT_SERVING at once; streams in flight get up to `grace` seconds to end."""
        await self._health.stop()
        if self._server is not None:
            await self._server.stop(grace)


def build_picker(
    settings: ServerSettings,
    proxy: Proxy,
    report: Callable[[], HealthReport],
    tls: grpc.ServerCredentials | None,
    supervise: Supervise | None = None,
) -> PickerServer | None:
    """The endpoint picker `settings` ask for (`--ext-proc-port`), None without; `tls` None
    reads `--ext-proc-tls-cert` here when set (blocking)."""
    if settings.ext_proc_port is None:
        return None
    cert, key = settings.ext_proc_tls_cert, settings.ext_proc_tls_key
    if tls is None and cert is not None and key is not None:
        tls = picker_credentials(cert, key)
    return PickerServer(
        proxy,
        report,
        host=settings.host,
        port=settings.ext_proc_port,
        credentials=tls,
        fallbacks=settings.ext_proc_fallbacks,
        supervise=supervise,
    )
