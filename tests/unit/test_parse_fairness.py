"""The body-parsing workers' queue: fair between clients, bounded, with workers faked.

A `Gated` worker reads a body only when the test opens its gate, so the order in
which queued bodies are started is seen exactly, with no process and no timing.
`huge(...)` bodies are over the pool's large-body bound, the others under it.
"""

from __future__ import annotations

import asyncio

from headcount.proxy.fairqueue import FairQueue
from headcount.proxy.parsepool import ParsePool, Worker
from headcount.proxy.payload import UNAVAILABLE, Outcome
from headcount.sim.cluster.polling import wait_until

__all__: list[str] = []

ATTACKER, VICTIM = "10.0.0.6", "10.0.0.7"


def huge(name: bytes) -> bytes:
    """A body over the large-body bound (1 MiB), named by its first bytes."""
    return name + b" " * (1024 * 1024)


class Gated:
    """A worker that records each body it is asked to read and answers when its gate opens."""

    def __init__(self, started: list[bytes], gates: list[asyncio.Future[None]]) -> None:
        self.started = started
        self.gates = gates
        self.alive = True

    async def ask(self, head: bytes, meta: bytes, body: bytes) -> Outcome:
        gate = asyncio.get_running_loop().create_future()
        self.started.append(body)
        self.gates.append(gate)
        await gate
        return (body.decode(), None)

    def kill(self) -> None:
        self.alive = False


class Pool:
    """A `ParsePool` of gated workers, and what they were asked."""

    def __init__(self, workers: int = 1, **bounds: int) -> None:
        self.started: list[bytes] = []
        self.gates: list[asyncio.Future[None]] = []
        self.pool = ParsePool(workers, 0, start=self._start, **bounds)

    async def _start(self, _memory_limit: int) -> Worker:
        return Gated(self.started, self.gates)

    def read(self, body: bytes, client: str) -> asyncio.Future[Outcome]:
        return asyncio.ensure_future(self.pool.read(body, None, [], client))

    async def busy(self, body: bytes, client: str) -> asyncio.Future[Outcome]:
        """Read `body`, and wait until the (only) worker has begun it."""
        read = self.read(body, client)
        await wait_until(lambda: body in self.started, timeout=5, what="the worker busy")
        return read

    def names(self) -> list[bytes]:
        """The bodies begun so far, by name (a huge body's first word)."""
        return [body.split(b" ", 1)[0] for body in self.started]

    def finish(self, name: bytes) -> None:
        """Let the read of the body named `name` finish."""
        self.gates[self.names().index(name)].set_result(None)

    async def begun(self, count: int) -> None:
        """Wait until `count` bodies have been begun."""
        await wait_until(lambda: len(self.started) == count, timeout=5, what=f"{count} begun")

    async def finish_one(self) -> None:
        """Let the oldest read still running finish, and the next one start."""
        done = sum(gate.done() for gate in self.gates)
        started = len(self.started)
        self.gates[done].set_result(None)
        await wait_until(
            lambda: len(self.started) > started or self.pool.waiting == 0,
            timeout=5,
            what="the next body started",
        )


async def test_a_small_body_waits_for_one_body_of_a_client_with_many_queued_not_for_all() -> None:
    pool = Pool()
    reads = [pool.read(b"a%d" % n, ATTACKER) for n in range(1, 7)]
    await wait_until(lambda: pool.started == [b"a1"] and pool.pool.waiting == 5, timeout=5)
    reads.append(pool.read(b"v1", VICTIM))
    await wait_until(lambda: pool.pool.waiting == 6, timeout=5)
    while len(pool.started) < 7:
        await pool.finish_one()
    assert pool.started == [b"a1", b"v1", b"a2", b"a3", b"a4", b"a5", b"a6"]
    pool.gates[-1].set_result(None)
    assert [await read for read in reads][-1] == ("v1", None)
    await pool.pool.close()


async def test_clients_that_all_queue_many_bodies_take_turns() -> None:
    pool = Pool()
    reads = [pool.read(b"a%d" % n, ATTACKER) for n in range(1, 4)]
    reads += [pool.read(b"b%d" % n, VICTIM) for n in range(1, 4)]
    await wait_until(lambda: len(pool.started) == 1 and pool.pool.waiting == 5, timeout=5)
    while len(pool.started) < 6:
        await pool.finish_one()
    assert pool.started == [b"a1", b"b1", b"a2", b"b2", b"a3", b"b3"]
    pool.gates[-1].set_result(None)
    await asyncio.gather(*reads)
    await pool.pool.close()


async def test_a_body_over_its_clients_share_of_the_queue_is_refused_at_once() -> None:
    pool = Pool(per_client=2, queued=8)
    reads = [await pool.busy(b"a1", ATTACKER)]
    reads += [pool.read(b"a%d" % n, ATTACKER) for n in (2, 3)]  # waiting: a2, a3
    await wait_until(lambda: pool.pool.waiting == 2, timeout=5)
    assert await pool.read(b"a4", ATTACKER) == UNAVAILABLE  # 503 `overloaded`
    victim = pool.read(b"v1", VICTIM)  # another client still has room
    await wait_until(lambda: pool.pool.waiting == 3, timeout=5)
    while len(pool.started) < 4:
        await pool.finish_one()
    pool.gates[-1].set_result(None)
    assert await victim == ("v1", None)
    assert [await read for read in reads] == [("a1", None), ("a2", None), ("a3", None)]
    await pool.pool.close()


async def test_bodies_over_the_queue_of_all_clients_are_refused_at_once() -> None:
    pool = Pool(per_client=8, queued=3)
    reads = [await pool.busy(b"c0", "10.0.1.0")]
    reads += [pool.read(b"c%d" % n, f"10.0.1.{n}") for n in (1, 2, 3)]  # 3 wait
    await wait_until(lambda: pool.pool.waiting == 3, timeout=5)
    assert await pool.read(b"late", "10.0.2.1") == UNAVAILABLE
    while len(pool.started) < 4:
        await pool.finish_one()
    pool.gates[-1].set_result(None)
    assert len(await asyncio.gather(*reads)) == 4
    await pool.pool.close()


async def test_a_reader_that_stops_waiting_gives_its_place_in_the_queue_back() -> None:
    pool = Pool(per_client=1, queued=8)
    first = await pool.busy(b"a1", ATTACKER)
    second = pool.read(b"a2", ATTACKER)
    await wait_until(lambda: pool.pool.waiting == 1, timeout=5)
    second.cancel()  # its client left
    await wait_until(lambda: pool.pool.waiting == 0, timeout=5)
    third = pool.read(b"a3", ATTACKER)  # has the place a2 held
    await wait_until(lambda: pool.pool.waiting == 1, timeout=5)
    await pool.finish_one()
    pool.gates[-1].set_result(None)
    assert (await first, await third) == (("a1", None), ("a3", None))
    assert pool.started == [b"a1", b"a3"]
    await pool.pool.close()


async def test_a_small_body_starts_at_once_while_all_but_one_worker_read_huge_bodies() -> None:
    pool = Pool(workers=3)
    reads = [pool.read(huge(b"h%d" % n), ATTACKER) for n in range(1, 6)]
    await wait_until(
        lambda: len(pool.started) >= 2 and len(pool.started) + pool.pool.waiting == 5,
        timeout=5,
        what="huge bodies begun or queued",
    )
    reads.append(pool.read(b"v1", VICTIM))
    await wait_until(lambda: b"v1" in pool.started, timeout=5, what="the small body begun")
    assert pool.names() == [b"h1", b"h2", b"v1"]  # the third worker was kept for small bodies
    pool.finish(b"v1")
    assert await reads[-1] == ("v1", None)
    for begun, name in enumerate((b"h1", b"h2", b"h3"), start=4):
        pool.finish(name)  # its worker takes the next huge body
        await pool.begun(begun)
    assert pool.names() == [b"h1", b"h2", b"v1", b"h3", b"h4", b"h5"]
    pool.finish(b"h4")
    pool.finish(b"h5")
    await asyncio.gather(*reads)
    await pool.pool.close()


async def test_a_clients_small_body_is_not_behind_its_own_huge_ones() -> None:
    pool = Pool(workers=2)
    reads = [pool.read(huge(b"h%d" % n), ATTACKER) for n in range(1, 4)]
    await wait_until(lambda: pool.pool.waiting == 2, timeout=5, what="huge bodies queued")
    reads += [pool.read(b"a%d" % n, ATTACKER) for n in range(1, 3)]
    await wait_until(lambda: len(pool.started) == 2, timeout=5, what="a small body begun")
    pool.finish(b"h1")  # its worker takes the next huge body, not a small one
    await pool.begun(3)
    pool.finish(b"a1")  # its worker takes the next small body
    await pool.begun(4)
    assert pool.names() == [b"h1", b"a1", b"h2", b"a2"]
    pool.finish(b"a2")
    pool.finish(b"h2")
    await pool.begun(5)
    pool.finish(b"h3")
    await asyncio.gather(*reads)
    await pool.pool.close()


async def test_one_worker_busy_with_a_huge_body_gets_a_second_lane_for_small_ones() -> None:
    pool = Pool(workers=1)
    huge_read = await pool.busy(huge(b"h1"), ATTACKER)
    later_huge = pool.read(huge(b"h2"), ATTACKER)
    small = pool.read(b"v1", VICTIM)
    await wait_until(lambda: b"v1" in pool.started, timeout=5, what="the small body begun")
    assert pool.names() == [b"h1", b"v1"] and pool.pool.waiting == 1
    pool.finish(b"v1")
    assert await small == ("v1", None)
    small = await pool.busy(b"v2", VICTIM)
    assert pool.pool.workers == 2  # the second lane is kept while a huge body is read
    pool.finish(b"v2")
    pool.finish(b"h1")  # its worker takes h2
    await pool.begun(4)
    assert pool.names() == [b"h1", b"v1", b"v2", b"h2"]
    pool.finish(b"h2")
    await asyncio.gather(huge_read, later_huge, small)
    await wait_until(lambda: pool.pool.workers == 1, timeout=5, what="the second lane stopped")
    await pool.pool.close()


# -- the queue itself -----------------------------------------------------------------------


def test_a_client_new_to_the_queue_goes_before_one_just_served() -> None:
    queue = FairQueue[str](per_client=8, total=16)
    for item in ("a1", "a2", "a3"):
        assert queue.push("a", item)
    assert queue.pop() == "a1"
    assert queue.push("b", "b1") and queue.push("b", "b2")
    assert queue.push("c", "c1")
    assert [queue.pop() for _ in range(6)] == ["b1", "c1", "a2", "b2", "a3", None]
    assert len(queue) == 0


def test_a_client_that_emptied_its_queue_starts_afresh() -> None:
    queue = FairQueue[str](per_client=8, total=16)
    queue.push("a", "a1")
    queue.push("b", "b1")
    queue.push("b", "b2")
    assert queue.pop() == "a1"  # a has nothing left waiting
    assert queue.pop() == "b1"
    queue.push("a", "a2")  # waiting anew: a goes before b, which was served
    assert [queue.pop(), queue.pop()] == ["a2", "b2"]


def test_the_queue_bounds_each_client_and_all_and_removal_gives_room_back() -> None:
    queue = FairQueue[str](per_client=2, total=3)
    assert queue.push("a", "a1") and queue.push("a", "a2")
    assert not queue.push("a", "a3")
    assert queue.push("b", "b1")
    assert not queue.push("c", "c1")
    queue.remove("a", "a1")
    queue.remove("a", "gone")  # not there: nothing changes
    assert len(queue) == 2
    assert queue.push("a", "a3")
    queue.remove("b", "b1")
    assert [queue.pop(), queue.pop(), queue.pop()] == ["a2", "a3", None]
