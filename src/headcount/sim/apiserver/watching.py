"""WATCH as the real server streams it: chunked JSON events, resumed from a resourceVersion.

A watch first replays what it missed (or, from no version, ADDs everything it
selects), then follows live changes; it sends BOOKMARKs when allowed and ends
after ``timeoutSeconds``. A version the history no longer holds gets one
ERROR event carrying 410 Expired, as the real server answers it.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from headcount.sim.apiserver.faults import Faults
from headcount.sim.apiserver.resources import Resource
from headcount.sim.apiserver.selectors import parse_field_selector, parse_label_selector
from headcount.sim.apiserver.status import StatusError, bad_request
from headcount.sim.apiserver.store import Store
from headcount.sim.apiserver.tables import table_format
from headcount.sim.apiserver.watch import Watch
from headcount.sim.apiserver.wire import NUMBER, json_line, parse_bool, parse_version

__all__ = ["WatchStreams"]


class WatchStreams:
    """Serves each WATCH request as one chunked stream, silent while a fault says so."""

    def __init__(self, store: Store, faults: Faults, bookmark_interval: float) -> None:
        self._store = store
        self._faults = faults
        self._bookmark_interval = bookmark_interval

    async def serve(
        self, request: web.Request, resource: Resource, namespace: str | None
    ) -> web.StreamResponse:
        query = request.query
        timeout = query.get("timeoutSeconds")
        if timeout is not None and not NUMBER.fullmatch(timeout):
            raise bad_request(f"timeoutSeconds: Invalid value: {timeout!r}")
        watch = Watch(
            resource=resource,
            namespace=namespace,
            labels=parse_label_selector(query.get("labelSelector", "")),
            fields=parse_field_selector(query.get("fieldSelector", ""), resource),
            table=table_format(request),
            transport=request.transport,
        )
        bookmarks = parse_bool("allowWatchBookmarks", query.get("allowWatchBookmarks"))
        since = parse_version(query.get("resourceVersion"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            self._store.start_watch(watch, since)
        except StatusError as expired:
            await response.prepare(request)
            await response.write(json_line({"type": "ERROR", "object": expired.to_status()}))
            await response.write_eof()
            return response
        try:
            while self._faults.silenced and watch.ending is None:
                await _doze(watch, None)
            await response.prepare(request)
            await self._stream(watch, response, bookmarks, int(timeout) if timeout else None)
        except ConnectionError:
            watch.ending = "abort"
        finally:
            self._store.watches.discard(watch)
            watch.finished.set()
        return response

    async def _stream(
        self, watch: Watch, response: web.StreamResponse, bookmarks: bool, timeout: int | None
    ) -> None:
        loop = asyncio.get_running_loop()
        interval = self._bookmark_interval
        deadline = loop.time() + timeout if timeout else None
        next_bookmark = loop.time() + interval if bookmarks else None
        while True:
            watch.wake.clear()
            if watch.ending is not None:
                break
            if self._faults.silenced:
                await _doze(watch, None)
                continue
            if watch.pending:
                await response.write(watch.encode(*watch.pending.popleft()))
                continue
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            if next_bookmark is not None and now >= next_bookmark:
                await response.write(self._bookmark(watch.resource))
                next_bookmark = now + interval
                continue
            wakeups = [t for t in (deadline, next_bookmark) if t is not None]
            await _doze(watch, min(wakeups) - now if wakeups else None)
        if watch.ending != "abort":
            await response.write_eof()

    def _bookmark(self, resource: Resource) -> bytes:
        metadata = {"resourceVersion": str(self._store.resource_version)}
        return json_line({"type": "BOOKMARK", "object": resource.typed({"metadata": metadata})})


async def _doze(watch: Watch, seconds: float | None) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(watch.wake.wait(), seconds)
    watch.wake.clear()
