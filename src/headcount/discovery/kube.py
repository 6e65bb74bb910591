"""The boundary to the Kubernetes API: where to connect, and list+watch over raw JSON.

`load_kube_config` finds the cluster (an explicit kubeconfig, else in-cluster,
else `$KUBECONFIG`, else `~/.kube/config`) and the default namespace.
`KubeListerWatcher` is a reflector's `ListerWatcher` over kubernetes_asyncio's
`ApiClient`, reading raw JSON (no client models) with a client-side timeout on
every call: the LIST as a whole, the WATCH's connect and headers, and every
read of the stream (idle timeout, armed around the read only, never across a
`yield`). `build_k8s_source` wires a pod or Service source from settings.

Foreign exceptions are translated here into the tree of `reflector.py`:

    connect refused, reset, broken stream (aiohttp, OSError)  -> ApiUnreachable
    no answer within the client-side timeout                  -> ApiTimeout
    HTTP 410, or an in-stream ERROR event with code 410       -> WatchExpired
    any other non-2xx answer or in-stream ERROR event         -> ApiStatusError(code)
    no byte of the watch stream for the idle timeout          -> WatchIdle
    a body or watch line that is not the JSON we expect       -> BadResponse
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from headcount import __version__
from headcount.config import ConfigError, DiscoveryMode, DiscoverySettings
from headcount.discovery.pods import PodSource
from headcount.discovery.reflector import (
    ApiStatusError,
    ApiTimeout,
    ApiUnreachable,
    BadResponse,
    KubeError,
    KubeObject,
    ReflectorTiming,
    WatchEvent,
    WatchExpired,
    WatchIdle,
    gc_paused,
)
from headcount.discovery.services import ServiceSource
from headcount.discovery.source import DiscoverySource, SourceStatus
from headcount.fleet import Fleet

__all__ = [
    "RESOURCE_PATHS",
    "KubeConfig",
    "KubeListerWatcher",
    "build_k8s_source",
    "load_kube_config",
]

logger = logging.getLogger(__name__)

RESOURCE_PATHS: Mapping[str, str] = {
    "pods": "/api/v1/namespaces/{namespace}/pods",
    "services": "/api/v1/namespaces/{namespace}/services",
    "endpointslices": "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
}

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

_MAX_LINE = 16 * 1024 * 1024
"""Longest watch line accepted; etcd caps an object at 1.5 MiB, so this is generous."""
_MAX_ERROR_BODY = 64 * 1024

_Query = list[tuple[str, str]]


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate, plus the default namespace."""

    configuration: Configuration
    namespace: str
    origin: str
    """For the logs: `in-cluster` or the kubeconfig path(s)."""


async def load_kube_config(
    kubeconfig: Path | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> KubeConfig:
    """An explicit `kubeconfig`, else in-cluster, else `$KUBECONFIG`, else `~/.kube/config`.

    The namespace is the in-cluster pod's own, else the kubeconfig context's,
    else `default`. Raises `ConfigError` saying what was tried.
    """
    if kubeconfig is not None:
        return await _from_kubeconfig(str(kubeconfig))
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return await asyncio.to_thread(_in_cluster, environ, service_account_dir)
    return await _from_kubeconfig(await asyncio.to_thread(_default_kubeconfig, environ))


def _default_kubeconfig(environ: Mapping[str, str]) -> str:
    """`$KUBECONFIG` (a path list) or `~/.kube/config`, if any of it exists."""
    paths = environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not any(Path(path).expanduser().is_file() for path in paths.split(os.pathsep) if path):
        raise ConfigError(
            f"no Kubernetes configuration: not in a cluster (KUBERNETES_SERVICE_HOST unset) "
            f"and no kubeconfig at {paths}; pass --kubeconfig PATH"
        )
    return paths


async def _from_kubeconfig(paths: str) -> KubeConfig:
    configuration = Configuration()
    try:
        loader = await k8s_config.load_kube_config(
            config_file=paths, client_configuration=configuration, persist_config=False
        )
    except (
        k8s_config.ConfigException,
        OSError,
        ValueError,
        yaml.YAMLError,
        TypeError,
        KeyError,
        AttributeError,
    ) as exc:
        reason = str(exc).replace("\n", " ") or type(exc).__name__
        raise ConfigError(f"kubeconfig {paths} cannot be used: {reason}") from None
    context = (loader.current_context or {}).get("context") or {}
    return KubeConfig(configuration, context.get("namespace") or "default", paths)


def _in_cluster(environ: Mapping[str, str], service_account_dir: Path) -> KubeConfig:
    configuration = Configuration()
    try:
        InClusterConfigLoader(
            token_filename=str(service_account_dir / "token"),
            cert_filename=str(service_account_dir / "ca.crt"),
            environ=dict(environ),
        ).load_and_set(configuration)
    except (k8s_config.ConfigException, OSError) as exc:
        raise ConfigError(f"in-cluster Kubernetes configuration: {exc}") from None
    namespace_file = service_account_dir / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else ""
    return KubeConfig(configuration, namespace or "default", "in-cluster")


class KubeListerWatcher:
    """A `ListerWatcher` for one resource (`pods`, `services`, `endpointslices`) in a namespace."""

    def __init__(
        self,
        api: ApiClient,
        resource: str,
        namespace: str,
        *,
        request_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        idle_timeout: float = 90.0,
    ) -> None:
        """`request_timeout` bounds a LIST and a WATCH's headers; `idle_timeout` each watch read."""
        self._api = api
        self._resource = resource
        self._path = RESOURCE_PATHS[resource].format(namespace=namespace)
        self._request_timeout = request_timeout
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout

    async def list(self, label_selector: str) -> tuple[list[KubeObject], str]:
        what = f"LIST {self._resource}"
        timeout = aiohttp.ClientTimeout(
            total=self._request_timeout,
            connect=self._connect_timeout,
            sock_connect=self._connect_timeout,
        )
        with _translated(what, self._request_timeout):
            async with asyncio.timeout(self._request_timeout):
                response = await self._open(_selector_query(label_selector), timeout, what)
                try:
                    body = await response.read()
                finally:
                    response.release()
        with gc_paused():
            return _parse_list(body, what)

    @asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_seconds: int, label_selector: str
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        what = f"WATCH {self._resource}"
        query = [
            *_selector_query(label_selector),
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
            ("allowWatchBookmarks", "true"),
        ]
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self._connect_timeout, sock_connect=self._connect_timeout
        )
        with _translated(what, self._request_timeout):
            async with asyncio.timeout(self._request_timeout):
                response = await self._open(query, timeout, what)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds + self._request_timeout
        events = self._events(response, what, deadline)
        try:
            yield events
        finally:
            await events.aclose()
            response.close()

    async def reachable(self) -> bool:
        """`GET /version` answers (any status) within the connect timeout."""
        timeout = aiohttp.ClientTimeout(total=self._connect_timeout)
        try:
            async with asyncio.timeout(self._connect_timeout):
                response: aiohttp.ClientResponse = await self._api.call_api(
                    "/version",
                    "GET",
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _request_timeout=timeout,
                )
        except ApiException:
            return True
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False
        response.close()
        return True

    async def _open(
        self, query: _Query, timeout: aiohttp.ClientTimeout, what: str
    ) -> aiohttp.ClientResponse:
        """Send the GET and check its status; the caller bounds it in time."""
        response: aiohttp.ClientResponse = await self._api.call_api(
            self._path,
            "GET",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )
        try:
            await _raise_for_status(response, what)
        except BaseException:
            response.close()
            raise
        return response

    async def _events(
        self, response: aiohttp.ClientResponse, what: str, deadline: float
    ) -> AsyncGenerator[WatchEvent, None]:
        """Events until the server ends the stream (or should have: `deadline`)."""
        lines = _LineSplitter(_MAX_LINE, what)
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            chunk = await self._read(response, what)
            if not chunk:
                lines.finish()
                return
            for line in lines.feed(chunk):
                yield _parse_event(line, what)
        logger.debug("%s: the server kept the watch past its timeout; ending it", what)

    async def _read(self, response: aiohttp.ClientResponse, what: str) -> bytes:
        """One read of the stream, bounded by the idle timeout (and only the read)."""
        try:
            async with asyncio.timeout(self._idle_timeout):
                return await response.content.readany()
        except TimeoutError:
            raise WatchIdle(
                f"{what}: no event, bookmark or byte for {self._idle_timeout:g}s"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ApiUnreachable(f"{what}: stream broken: {_reason(exc)}") from exc


class _LineSplitter:
    """Splits a byte stream into non-empty lines, whatever the chunking; bounded in memory."""

    def __init__(self, max_line: int, what: str) -> None:
        self._partial = bytearray()
        self._max_line = max_line
        self._what = what

    def feed(self, chunk: bytes) -> list[bytes]:
        self._partial += chunk
        if b"\n" not in chunk:
            if len(self._partial) > self._max_line:
                raise BadResponse(f"{self._what}: a watch line exceeds {self._max_line} bytes")
            return []
        *lines, rest = self._partial.split(b"\n")
        self._partial = bytearray(rest)
        return [bytes(line) for line in lines if line.strip()]

    def finish(self) -> None:
        """The stream ended: a partial line left over means an event was cut."""
        if self._partial.strip():
            raise BadResponse(f"{self._what}: the stream ended in the middle of an event")


@contextmanager
def _translated(what: str, timeout: float) -> Iterator[None]:
    """Turn the client's exceptions into the reflector's tree, most specific first."""
    try:
        yield
    except TimeoutError as exc:
        raise ApiTimeout(f"{what}: no answer within {timeout:g}s") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise ApiUnreachable(f"{what}: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _selector_query(label_selector: str) -> _Query:
    return [("labelSelector", label_selector)] if label_selector else []


async def _raise_for_status(response: aiohttp.ClientResponse, what: str) -> None:
    if 200 <= response.status < 300:
        return
    body = await response.content.read(_MAX_ERROR_BODY)
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if not isinstance(status, dict):
        status = {"message": body.decode("utf-8", "replace").strip() or response.reason}
    raise _status_error(status, what, response.status)


def _status_error(status: Mapping[str, Any], what: str, code: int | None = None) -> KubeError:
    """The exception for a `Status` object, from an HTTP error or an in-stream ERROR event."""
    code = code or _int_or_none(status.get("code"))
    message = status.get("message") or status.get("reason") or "no message"
    if code == 410:
        return WatchExpired(f"{what}: 410 Gone: {message}")
    if code is None:
        return BadResponse(f"{what}: ERROR event without a code: {message}")
    return ApiStatusError(code, f"{what}: HTTP {code}: {message}")


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _parse_list(body: bytes, what: str) -> tuple[list[KubeObject], str]:
    try:
        document = json.loads(body)
        items = document.get("items") or []
        resource_version = document["metadata"]["resourceVersion"]
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        raise BadResponse(f"{what}: not a list: {exc!r}") from None
    if not isinstance(items, list) or not isinstance(resource_version, str):
        raise BadResponse(f"{what}: not a list: items or resourceVersion of the wrong type")
    return items, resource_version


def _parse_event(line: bytes, what: str) -> WatchEvent:
    try:
        document = json.loads(line)
    except ValueError as exc:
        raise BadResponse(f"{what}: undecodable watch line: {exc}") from None
    if (
        not isinstance(document, dict)
        or not isinstance(document.get("type"), str)
        or not isinstance(document.get("object"), dict)
    ):
        raise BadResponse(f"{what}: a watch line that is not an event: {line[:200]!r}")
    if document["type"] == "ERROR":
        raise _status_error(document["object"], what)
    return WatchEvent(document["type"], document["object"])


class _ClientOwningSource:
    """A source that closes the API client it was built with when its loop ends."""

    def __init__(self, source: DiscoverySource, api: ApiClient) -> None:
        self.status: SourceStatus = source.status
        self._source = source
        self._api = api

    async def run(self) -> None:
        try:
            await self._source.run()
        finally:
            await self._api.close()


async def build_k8s_source(settings: DiscoverySettings, fleet: Fleet) -> DiscoverySource:
    """The pod or Service source `settings.mode` asks for; raises `ConfigError`.

    The API client lives as long as the returned source's `run()`.
    """
    if settings.mode not in (DiscoveryMode.K8S_PODS, DiscoveryMode.K8S_SERVICES):
        raise ConfigError(f"--discovery {settings.mode.value} is not a Kubernetes mode")
    kube = await load_kube_config(settings.kubeconfig)
    namespace = settings.namespace or kube.namespace
    api = ApiClient(kube.configuration)
    api.user_agent = f"headcount/{__version__}"
    timing = ReflectorTiming.from_settings(settings)

    def lister_watcher(resource: str) -> KubeListerWatcher:
        return KubeListerWatcher(
            api,
            resource,
            namespace,
            request_timeout=settings.request_timeout,
            connect_timeout=settings.connect_timeout,
            idle_timeout=settings.watch_idle_timeout,
        )

    source: DiscoverySource
    if settings.mode is DiscoveryMode.K8S_PODS:
        source = PodSource(
            fleet,
            lister_watcher("pods"),
            engine_port=settings.engine_port,
            label_selector=settings.label_selector,
            timing=timing,
        )
    else:
        source = ServiceSource(
            fleet,
            lister_watcher("services"),
            lister_watcher("endpointslices"),
            engine_port=settings.engine_port,
            label_selector=settings.label_selector,
            timing=timing,
        )
    logger.info(
        "discovery: %s in namespace %s (label selector %r) via %s at %s",
        settings.mode.value,
        namespace,
        settings.label_selector,
        kube.origin,
        kube.configuration.host,
    )
    return _ClientOwningSource(source, api)
