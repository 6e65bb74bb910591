"""One open watch: what it selects, what it still has to send, and how it must end.

A watch sees changes through its selectors: an object that stops matching is
DELETED for it, one that starts matching is ADDED, as the real server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from headcount.sim.apiserver.events import Event
from headcount.sim.apiserver.objects import JsonObject, labels_of, with_version
from headcount.sim.apiserver.resources import Resource
from headcount.sim.apiserver.selectors import FieldRequirement, Requirement
from headcount.sim.apiserver.tables import TableFormat
from headcount.sim.apiserver.wire import json_line

__all__ = ["Ending", "Watch", "end_watches"]

Ending = Literal["eof", "abort"]

_FINISH_TIMEOUT = 5.0
"""How long ending watches waits for them to be gone (a client that reads nothing)."""


@dataclass(eq=False)
class Watch:
    """One open watch stream: what it selects, what it still has to send, how it must end."""

    resource: Resource
    namespace: str | None
    labels: tuple[Requirement, ...]
    fields: tuple[FieldRequirement, ...]
    table: TableFormat | None
    transport: asyncio.BaseTransport | None
    pending: deque[tuple[str, JsonObject]] = field(default_factory=deque)
    ending: Ending | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def matches(self, obj: JsonObject) -> bool:
        if self.namespace is not None and obj["metadata"]["namespace"] != self.namespace:
            return False
        labels = labels_of(obj)
        return all(r.matches(labels) for r in self.labels) and all(
            f.matches(obj) for f in self.fields
        )

    def push(self, type_: str, obj: JsonObject) -> None:
        self.pending.append((type_, obj))
        self.wake.set()

    def offer(self, event: Event) -> None:
        """Queue `event` as this watch sees it: a selector the object leaves or enters turns
        a modification into DELETED (the previous state at the new version) or ADDED."""
        if event.resource is not self.resource:
            return
        now = event.type != "DELETED" and self.matches(event.obj)
        before = event.old is not None and self.matches(event.old)
        if now:
            self.push("MODIFIED" if before else "ADDED", event.obj)
        elif before and event.old is not None:
            self.push("DELETED", with_version(event.old, event.resource_version))

    def end(self, how: Ending) -> None:
        self.ending = self.ending or how
        self.wake.set()

    def encode(self, type_: str, obj: JsonObject) -> bytes:
        if self.table is not None:
            version = int(obj["metadata"]["resourceVersion"])
            wrapped = self.table.table(self.resource, [obj], version)
        else:
            wrapped = self.resource.typed(obj)
        return json_line({"type": type_, "object": wrapped})


async def end_watches(watches: Iterable[Watch], how: Ending, *, reset: bool = False) -> None:
    """End each watch, its connection first reset if asked, and wait (boundedly) until gone."""
    ending = list(watches)
    for watch in ending:
        if reset:
            _reset(watch.transport)
        watch.end(how)
    await _finished(ending)


def _reset(transport: asyncio.BaseTransport | None) -> None:
    """Close a connection with a TCP RST rather than a FIN."""
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if isinstance(transport, asyncio.WriteTransport):
        transport.abort()
    else:
        transport.close()


async def _finished(watches: list[Watch]) -> None:
    waits = [asyncio.ensure_future(watch.finished.wait()) for watch in watches]
    if not waits:
        return
    _, late = await asyncio.wait(waits, timeout=_FINISH_TIMEOUT)
    for wait in late:
        wait.cancel()
