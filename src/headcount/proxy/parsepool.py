"""Large request bodies are read in worker processes, so that no body stalls the event loop.

Routing needs the body's `model` (and, for affinity policies, a key), which
means parsing its JSON. The C parser holds the GIL, and hostile input (deeply
nested empty arrays) makes it take seconds and many times the body's size in
objects, so a thread would stall the loop all the same. A body
larger than the inline bound goes to one of at most `workers` child processes
(2 if `workers` is 1, below) over a pipe: the loop only writes its bytes and reads back a few
(`payload.py` is both ends' code). Workers start on first use; one that dies
is replaced on the next request, and the request it was reading gets
`UNAVAILABLE` (503). A request whose client leaves stops waiting at once; its
worker finishes the parse and takes the next body.

Bodies over `large` bytes (1 MiB) are read in at most `workers - 1` workers at
once, so that one worker is always left for the bodies under it: a hostile
large body ties a worker up for seconds, a body under 1 MiB for at most ~65 ms
(hostile nesting; a real 200 KB prompt, a millisecond), so a small body never
waits behind a large one. With one worker, a second is started for a small
body while the first reads a large one, and stopped once it is idle. Small
and large bodies wait in queues of their own, and a worker goes on with the
kind it just read if one waits (so neither kind's lane is taken by the other),
else the other kind. In each queue clients take turns (`fairqueue.py`), by the
address their connection comes from: a client that sends many huge bodies
cannot make another's wait behind all of them, only behind one. A client with
`per_client` bodies waiting in one queue, or a queue with `queued` in all,
gets `UNAVAILABLE` (503 `overloaded`) for one more at once.

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

from headcount.compiled import source_of
from headcount.log_limit import LogLimit
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
data plane into every worker. Its source, even where mypyc compiled it: a compiled module
answers only to its own name."""
_PAYLOAD = str(source_of(Path(payload.__file__).resolve()))
_ROOT = str(Path(_PAYLOAD).parents[2])
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
_LARGE = 1024 * 1024
"""Bodies over this may not take the last worker: 16 x the loop's inline bound (64 KiB,
~4 ms of hostile JSON) is ~65 ms a body at worst, and holds a long-context prompt."""


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


_Queue = FairQueue[asyncio.Future[Worker | None]]


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
            _PAYLOAD,
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
        large: int = _LARGE,
    ) -> None:
        """`memory_limit`: bytes of address space a worker's parse may add (0: unbounded);
        `start`: how a worker is started (a child process; tests inject others);
        `per_client`, `queued`: bodies that may wait for a worker in each queue, of one
        client and in all (None: a number per worker, `_CLIENT_QUEUED_PER_WORKER`,
        `_QUEUED_PER_WORKER`); `large`: bodies over these bytes may not take the last worker."""
        self._max = workers
        self._large_max = max(1, workers - 1)
        """Workers that may read large bodies at once."""
        self._large_size = large
        self._memory_limit = memory_limit
        self._start_worker = start
        self._idle: list[Worker] = []
        self._count = 0
        """Workers running or starting."""
        self._large_busy = 0
        """Workers handed a large body and not yet released."""
        bounds = (
            per_client if per_client is not None else _CLIENT_QUEUED_PER_WORKER * workers,
            queued if queued is not None else _QUEUED_PER_WORKER * workers,
        )
        self._waiters: tuple[_Queue, _Queue] = (FairQueue(*bounds), FairQueue(*bounds))
        """Small bodies' waiters, large ones'."""
        self._tasks: set[asyncio.Future[Any]] = set()
        self._names: dict[KeySource, str | None] = {}
        self._closed = False
        self._logs = LogLimit(_log, _LOG_EVERY, time.monotonic)

    @property
    def waiting(self) -> int:
        """Bodies waiting for a worker."""
        return len(self._waiters[0]) + len(self._waiters[1])

    @property
    def workers(self) -> int:
        """Workers running or starting."""
        return self._count

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
        large = len(body) > self._large_size
        worker = await self._acquire(client, large)
        if worker is None:
            return UNAVAILABLE
        head, meta = payload.encode_request(body, name, headers)
        job = asyncio.ensure_future(self._ask(worker, large, head, meta, body))
        self._track(job)
        # A client that leaves stops waiting; the worker finishes and is released.
        return await asyncio.shield(job)

    async def close(self) -> None:
        """Stop every worker; requests still waiting get `UNAVAILABLE`."""
        self._closed = True
        for worker in self._idle:
            worker.kill()
        self._idle.clear()
        for queue in self._waiters:
            while (waiter := queue.pop()) is not None:
                if not waiter.done():
                    waiter.set_result(None)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- workers ------------------------------------------------------------------------------

    async def _acquire(self, client: str, large: bool) -> Worker | None:
        if self._closed:
            return None
        while self._idle and (not large or self._large_busy < self._large_max):
            worker = self._idle.pop()
            if worker.alive:
                self._large_busy += large
                return worker
            self._lost(worker, None, False)  # died while idle (killed, say): never handed a body
        waiter: asyncio.Future[Worker | None] = asyncio.get_running_loop().create_future()
        queue = self._waiters[large]
        if not queue.push(client, waiter):
            self._warn("too many request bodies wait to be read: answered 503 (%s)", client)
            return None
        if self._may_start(large):
            self._spawn()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and (handed := waiter.result()):
                self._release(handed, large)
            else:
                queue.remove(client, waiter)
            raise

    def _may_start(self, large: bool) -> bool:
        """Whether a body of that kind waiting may start another worker: a small one also
        when every worker reads a large one (with one worker: the second lane)."""
        if large:
            return self._count < self._max and self._large_busy < self._large_max
        return self._count < max(self._max, self._large_busy + 1)

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
            self._wake(None, False)
            return
        except asyncio.CancelledError:
            self._count -= 1
            raise
        self._release(worker, False)

    async def _ask(
        self, worker: Worker, large: bool, head: bytes, meta: bytes, body: bytes
    ) -> Outcome:
        try:
            outcome = await worker.ask(head, meta, body)
        except (OSError, EOFError, ValueError, asyncio.IncompleteReadError) as error:
            self._lost(worker, error, large)
            return UNAVAILABLE
        except asyncio.CancelledError:
            self._lost(worker, None, large)
            raise
        self._release(worker, large)
        return outcome

    def _release(self, worker: Worker, large: bool) -> None:
        """Take back `worker`, which read a body of that kind (a new one: False)."""
        self._large_busy -= large
        if not self._closed and self._wake(worker, large):
            return
        if self._closed or self._count > max(self._max, self._large_busy + 1):
            worker.kill()  # closing, or one worker's second lane once no large body is read
            self._count -= 1
        else:
            self._idle.append(worker)

    def _warn(self, message: str, detail: object) -> None:
        """At most one warning a minute, whichever: a hostile client can kill workers in a
        loop."""
        self._logs.log("pool", logging.WARNING, message, detail)

    def _wake(self, worker: Worker | None, large: bool) -> bool:
        """Hand `worker` (None: a failed start) to the waiting request whose turn it is, of
        the kind `large` says first: a large one only while fewer than `workers - 1` (at
        least 1) read large bodies."""
        for kind in (large, not large):
            if kind and worker is not None and self._large_busy >= self._large_max:
                continue
            while (waiter := self._waiters[kind].pop()) is not None:
                if not waiter.done():
                    waiter.set_result(worker)
                    if kind and worker is not None:
                        self._large_busy += 1
                    return True
        return False

    def _lost(self, worker: Worker, error: BaseException | None, large: bool) -> None:
        worker.kill()
        self._count -= 1
        self._large_busy -= large
        if error is not None:
            self._warn("a body-parsing worker died (%s); starting another", repr(error))
        if not self._closed and any(
            self._waiters[kind] and self._may_start(kind) for kind in (False, True)
        ):
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
