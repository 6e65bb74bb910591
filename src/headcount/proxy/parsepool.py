"""Large request bodies are read in worker processes, so that no body stalls the event loop.

Routing needs the body's `model` (and, for affinity policies, a key), which
means parsing its JSON. The C parser holds the GIL, and hostile input (deeply
nested empty arrays) makes it take seconds and many times the body's size in
objects, so a thread would stall the loop all the same. A body
larger than the inline bound goes to one of at most `workers` child processes
over a pipe: the loop only writes its bytes and reads back a few
(`payload.py` is both ends' code). Workers start on first use; one that dies
is replaced on the next request, and the request it was reading gets
`UNAVAILABLE` (503). A request whose client leaves stops waiting at once; its
worker finishes the parse and takes the next body.

Bodies waiting for a worker queue per client (the address their connection
comes from), and clients take turns (`fairqueue.py`): a client that sends many
huge bodies cannot make another's small one wait behind all of them, only
behind one. A client with `per_client` bodies waiting, or a pool with `queued`
in all, gets `UNAVAILABLE` (503 `overloaded`) for one more at once.

A key source a worker cannot import by name (a lambda, say) is run on the loop
instead, with a warning once: correct, only not protected.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from headcount.proxy import payload
from headcount.proxy.fairqueue import FairQueue
from headcount.proxy.payload import UNAVAILABLE, Outcome
from headcount.routing import KeySource

__all__ = ["ParsePool", "StartWorker", "Worker"]

_log = logging.getLogger(__name__)

_BOOT = (
    "import importlib.util, sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "spec = importlib.util.spec_from_file_location('headcount_payload_worker', sys.argv[2])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "sys.argv = sys.argv[2:]\n"
    "module.worker_main()\n"
)
"""Loads `payload.py` by path: importing the `headcount.proxy` package would load the whole
data plane into every worker."""
_ROOT = str(Path(payload.__file__).resolve().parents[2])
"""Where `headcount` is imported from, for the key sources a worker imports."""
_PIPE_SIZE = 1024 * 1024
"""Pipe buffer asked for (Linux allows an unprivileged process 1 MiB): fewer loop wakeups."""
_LOG_EVERY = 60.0
_QUEUED_PER_WORKER = 64
"""Bodies that may wait in all, per worker: a normal 100 KiB body is read in about a
millisecond, so a full queue is well under a second's work; a queue of hostile bodies
that each take seconds is refused instead of making every client wait minutes."""
_CLIENT_QUEUED_PER_WORKER = 16
"""Bodies one client may have waiting, per worker: room for a gateway's bursts, while no
client fills the queue for all."""


class Worker(Protocol):
    """What the pool needs of a worker: one body read at a time."""

    @property
    def alive(self) -> bool: ...

    async def ask(self, head: bytes, meta: bytes, body: bytes) -> Outcome:
        """The outcome of one body (`payload.encode_request`'s framing); raises when the
        worker dies (OSError, EOFError, ValueError, `IncompleteReadError`)."""
        ...

    def kill(self) -> None: ...


StartWorker = Callable[[int], Awaitable[Worker]]
"""Starts a worker whose parse may add at most that many bytes of address space (0: any)."""


class _Worker:
    """One child process, reading one body at a time."""

    __slots__ = ("_process",)

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @classmethod
    async def start(cls, memory_limit: int) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-c",
            _BOOT,
            _ROOT,
            payload.__file__,
            str(memory_limit),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        if process.stdin is not None:
            pipe = process.stdin.get_extra_info("pipe")
            if pipe is not None:
                with contextlib.suppress(OSError, AttributeError):
                    fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        return cls(process)

    async def ask(self, head: bytes, meta: bytes, body: bytes) -> Outcome:
        stdin, stdout = self._process.stdin, self._process.stdout
        if stdin is None or stdout is None:
            raise EOFError("worker has no pipes")
        stdin.write(head)
        stdin.write(meta)
        stdin.write(body)
        await stdin.drain()
        size = int.from_bytes(await stdout.readexactly(4), "big")
        return payload.decode_outcome(await stdout.readexactly(size))

    @property
    def alive(self) -> bool:
        return self._process.returncode is None

    def kill(self) -> None:
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()


class ParsePool:
    """Reads request bodies in at most `workers` child processes; see the module docstring."""

    def __init__(
        self,
        workers: int,
        memory_limit: int,
        *,
        start: StartWorker = _Worker.start,
        per_client: int | None = None,
        queued: int | None = None,
    ) -> None:
        """`memory_limit`: bytes of address space a worker's parse may add (0: unbounded);
        `start`: how a worker is started (a child process; tests inject others);
        `per_client`, `queued`: bodies that may wait for a worker, of one client and in all
        (None: a number per worker, `_CLIENT_QUEUED_PER_WORKER`, `_QUEUED_PER_WORKER`)."""
        self._max = workers
        self._memory_limit = memory_limit
        self._start_worker = start
        self._idle: list[Worker] = []
        self._count = 0
        """Workers running or starting."""
        self._waiters: FairQueue[asyncio.Future[Worker | None]] = FairQueue(
            per_client if per_client is not None else _CLIENT_QUEUED_PER_WORKER * workers,
            queued if queued is not None else _QUEUED_PER_WORKER * workers,
        )
        self._tasks: set[asyncio.Future[Any]] = set()
        self._names: dict[KeySource, str | None] = {}
        self._closed = False
        self._logged_at = -_LOG_EVERY
        self._unlogged = 0

    @property
    def waiting(self) -> int:
        """Bodies waiting for a worker."""
        return len(self._waiters)

    async def read(
        self,
        body: bytes,
        key_source: KeySource | None,
        headers: Sequence[tuple[bytes, bytes]],
        client: str = "",
    ) -> Outcome:
        """`(model, key)` of `body`, or why it cannot be routed (`payload`'s codes); `client`:
        where the body comes from (`Request.client`), whose turn it waits for."""
        name = None
        if key_source is not None:
            name = self._name(key_source)
            if name is None:
                lookup = dict(reversed(headers)).get
                return payload.read_payload(body, key_source, lookup)
        worker = await self._acquire(client)
        if worker is None:
            return UNAVAILABLE
        head, meta = payload.encode_request(body, name, headers)
        job = asyncio.ensure_future(self._ask(worker, head, meta, body))
        self._track(job)
        # A client that leaves stops waiting; the worker finishes and is released.
        return await asyncio.shield(job)

    async def close(self) -> None:
        """Stop every worker; requests still waiting get `UNAVAILABLE`."""
        self._closed = True
        for worker in self._idle:
            worker.kill()
        self._idle.clear()
        while (waiter := self._waiters.pop()) is not None:
            if not waiter.done():
                waiter.set_result(None)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- workers ------------------------------------------------------------------------------

    async def _acquire(self, client: str) -> Worker | None:
        if self._closed:
            return None
        while self._idle:
            worker = self._idle.pop()
            if worker.alive:
                return worker
            self._lost(worker, None)  # died while idle (killed, say): never handed a body
        waiter: asyncio.Future[Worker | None] = asyncio.get_running_loop().create_future()
        if not self._waiters.push(client, waiter):
            self._warn("too many request bodies wait to be read: answered 503 (%s)", client)
            return None
        if self._count < self._max:
            self._spawn()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and (handed := waiter.result()):
                self._release(handed)
            else:
                self._waiters.remove(client, waiter)
            raise

    def _spawn(self) -> None:
        self._count += 1
        self._track(asyncio.ensure_future(self._start()))

    def _track(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self) -> None:
        try:
            worker = await self._start_worker(self._memory_limit)
        except (OSError, ValueError) as error:
            self._count -= 1
            self._warn("cannot start a body-parsing worker: %s", error)
            self._wake(None)
            return
        except asyncio.CancelledError:
            self._count -= 1
            raise
        self._release(worker)

    async def _ask(self, worker: Worker, head: bytes, meta: bytes, body: bytes) -> Outcome:
        try:
            outcome = await worker.ask(head, meta, body)
        except (OSError, EOFError, ValueError, asyncio.IncompleteReadError) as error:
            self._lost(worker, error)
            return UNAVAILABLE
        except asyncio.CancelledError:
            self._lost(worker, None)
            raise
        self._release(worker)
        return outcome

    def _release(self, worker: Worker) -> None:
        if self._closed:
            worker.kill()
            self._count -= 1
            return
        if not self._wake(worker):
            self._idle.append(worker)

    def _wake(self, worker: Worker | None) -> bool:
        """Hand `worker` (None: a failed start) to the waiting request whose turn it is."""
        while (waiter := self._waiters.pop()) is not None:
            if not waiter.done():
                waiter.set_result(worker)
                return True
        return False

    def _lost(self, worker: Worker, error: BaseException | None) -> None:
        worker.kill()
        self._count -= 1
        if error is not None:
            self._warn("a body-parsing worker died (%s); starting another", repr(error))
        if self._waiters and not self._closed:
            self._spawn()

    def _name(self, key_source: KeySource) -> str | None:
        if key_source not in self._names:
            name = payload.key_source_name(key_source)
            if name is None:
                _log.warning(
                    "key source %r cannot be imported by a worker: large bodies are read "
                    "on the event loop",
                    key_source,
                )
            self._names[key_source] = name
        return self._names[key_source]

    def _warn(self, message: str, detail: object) -> None:
        """At most one warning a minute: a hostile client can kill workers in a loop."""
        now = time.monotonic()
        if now - self._logged_at < _LOG_EVERY:
            self._unlogged += 1
            return
        suffix = f" ({self._unlogged} more since the last)" if self._unlogged else ""
        self._logged_at, self._unlogged = now, 0
        _log.warning(message + suffix, detail)
