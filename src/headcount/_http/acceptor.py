"""Client connections accepted by the router itself, so that running out of descriptors is survived.

uvloop's own server hides an accept() that fails for want of file descriptors
(libuv accepts and drops the waiting connections on a reserve descriptor, and
tells no one) and, on any other accept error (ENOBUFS, ENOMEM, or EMFILE once
the reserve is gone), closes the listening socket for good while the process
carries on, deaf. Here the loop only watches the listening sockets; each
accept() is ours, and each connection is handed to the protocol factory
through `loop.connect_accepted_socket`:

- running out (EMFILE, ENFILE, ENOBUFS, ENOMEM) is reported to
  `LocalResources` (counted, logged once a minute, shown in `/health`) and
  accepting pauses for `_RETRY_DELAY` (the waiting connections stay in the
  kernel's backlog) instead of failing; it never reaches an engine's state;
- any other accept error is logged and accepting goes on;
- the connection limit itself is the protocol's (`ConnectionRegistry`): a
  connection over it is accepted and answered 503, never left in limbo.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from headcount._http.resources import LocalResources

__all__ = ["ClientListener", "listen"]

_log = logging.getLogger(__name__)

_BATCH = 32
"""Connections accepted per wakeup at most, so a burst cannot hold the loop (each costs a
task and a protocol)."""
_RETRY_DELAY = 0.1
"""Pause after running out before trying to accept again."""


class ClientListener:
    """Listening sockets and their accept loop: the part of `asyncio.Server` the router uses."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: list[socket.socket],
        factory: Callable[[], asyncio.Protocol],
        resources: LocalResources,
    ) -> None:
        self.sockets = sockets
        self._loop = loop
        self._factory = factory
        self._resources = resources
        self._serving = False
        self._retries: dict[int, asyncio.TimerHandle] = {}
        self._opening: set[asyncio.Task[object]] = set()

    def start(self) -> None:
        self._serving = True
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def is_serving(self) -> bool:
        return self._serving

    def close(self) -> None:
        """Stop accepting and close the listening sockets (open connections are not touched)."""
        if not self._serving:
            return
        self._serving = False
        for timer in self._retries.values():
            timer.cancel()
        self._retries.clear()
        for sock in self.sockets:
            with contextlib.suppress(OSError, ValueError):
                self._loop.remove_reader(sock.fileno())
            sock.close()

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(_BATCH):
            try:
                conn, _address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up while waiting in the backlog
            except OSError as error:
                if self._resources.record_error(error, "accepting a client connection"):
                    self._pause(sock)
                else:
                    _log.warning("accepting a client connection failed: %s", error)
                return
            try:
                conn.setblocking(False)
                task: asyncio.Task[object] = self._loop.create_task(
                    self._loop.connect_accepted_socket(self._factory, conn)
                )
            except Exception:
                conn.close()
                raise
            self._opening.add(task)
            task.add_done_callback(self._opened)

    def _opened(self, task: asyncio.Task[object]) -> None:
        self._opening.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            _log.debug("a client connection could not be opened: %r", error)

    def _pause(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        self._loop.remove_reader(fd)
        self._retries[fd] = self._loop.call_later(_RETRY_DELAY, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        self._retries.pop(sock.fileno(), None)
        if self._serving:
            self._loop.add_reader(sock.fileno(), self._accept, sock)


async def listen(
    host: str,
    port: int,
    factory: Callable[[], asyncio.Protocol],
    resources: LocalResources,
    *,
    reuse_port: bool = False,
    backlog: int = 2048,
) -> ClientListener:
    """Listen on every address of `host` (as `loop.create_server` does) and start accepting."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    listener = ClientListener(loop, sockets, factory, resources)
    listener.start()
    return listener
