"""The boundary to the Kubernetes API: list+watch over raw JSON, with a timeout on every call.

`KubeListerWatcher` is a reflector's `ListerWatcher` over kubernetes_asyncio's
`ApiClient`, reading raw JSON (no client models) with a client-side timeout on
every call: the LIST as a whole, the WATCH's connect and headers, and every
read of the stream (idle timeout, armed around the read only, never across a
`yield`).

Foreign exceptions are translated here into the tree of `errors.py`:

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
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from headcount.discovery.errors import (
    ApiStatusError,
    ApiTimeout,
    ApiUnreachable,
    BadResponse,
    KubeError,
    WatchExpired,
    WatchIdle,
)
from headcount.discovery.gc_pause import gc_paused
from headcount.discovery.listwatch import KubeObject, WatchEvent

__all__ = ["RESOURCE_PATHS", "KubeListerWatcher"]

_log = logging.getLogger(__name__)

RESOURCE_PATHS: Mapping[str, str] = {
    "pods": "/api/v1/namespaces/{namespace}/pods",
    "services": "/api/v1/namespaces/{namespace}/services",
    "endpointslices": "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
    "inferencepools": "/apis/inference.networking.k8s.io/v1/namespaces/{namespace}/inferencepools",
}

_MAX_LINE = 16 * 1024 * 1024
"""Longest watch line accepted; etcd caps an object at 1.5 MiB, so this is generous."""
_MAX_ERROR_BODY = 64 * 1024

_Query = list[tuple[str, str]]


class KubeListerWatcher:
    """A `ListerWatcher` for one resource (a key of `RESOURCE_PATHS`) in a namespace."""

    def __init__(
        self,
        api: ApiClient,
        resource: str,
        namespace: str,
        *,
        request_timeout: float,
        connect_timeout: float,
        idle_timeout: float,
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
        _log.debug("%s: the server kept the watch past its timeout; ending it", what)

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
    """Turn the client's exceptions into the tree of `errors.py`, most specific first."""
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
