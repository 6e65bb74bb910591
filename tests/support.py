"""Test helpers shared across the suite: waits that fail the test, raw engines, the metric list.

The simulated cluster, the router process and its client are the product's
own harness (`headcount.sim.cluster`, `headcount.sim.loopback`); what is here
only tests need: a wait that times out is an `AssertionError`, scripted
engines that say exact bytes, and the metric families the README promises.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import TypeVar

from headcount.sim import cluster

__all__ = [
    "EXPORTED_METRICS",
    "HISTOGRAMS",
    "KV_METRIC_LABELS",
    "METRIC_LABELS",
    "EngineConnection",
    "KvEventRecorder",
    "RawEngine",
    "Script",
    "blackholed_listener",
    "raw_engine",
    "wait_until",
    "wait_until_async",
]

T = TypeVar("T")

# ------------------------------------------------------------------ waiting


async def wait_until(
    condition: Callable[[], T], *, timeout: float = 5.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll `condition` until it returns a truthy value; fail the test after `timeout` seconds."""
    return await _failing_on_timeout(condition, timeout, interval, what)


async def wait_until_async(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout: float = 5.0,
    interval: float = 0.05,
    what: str = "",
) -> T:
    """Like `wait_until`, for a condition that must be awaited (and may raise meanwhile)."""
    return await _failing_on_timeout(condition, timeout, interval, what)


async def _failing_on_timeout(
    condition: Callable[[], T] | Callable[[], Awaitable[T]],
    timeout: float,
    interval: float,
    what: str,
) -> T:
    try:
        value: T = await cluster.wait_until(
            condition, timeout=timeout, interval=interval, what=what
        )
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None
    return value


# ------------------------------------------------------------------ engines that say exact bytes

RAW_TIMEOUT = 5.0


class EngineConnection:
    """One accepted connection of a `RawEngine`, read request by request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def read_request(self) -> tuple[bytes, bytes] | None:
        """The next request's head and body, or None when the client closed."""
        try:
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), RAW_TIMEOUT)
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await asyncio.wait_for(self.reader.readexactly(length), RAW_TIMEOUT)
        return head, body

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


Script = Callable[[EngineConnection], Awaitable[None]]


class RawEngine:
    """A loopback HTTP server whose every connection runs `script`; counts connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.accepted = 0
        self.port = 0
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await self.script(EngineConnection(reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def raw_engine(script: Script) -> AsyncIterator[RawEngine]:
    engine = RawEngine(script)
    server = await asyncio.start_server(engine._serve, "127.0.0.1", 0)
    engine.port = server.sockets[0].getsockname()[1]
    engine.url = f"http://127.0.0.1:{engine.port}"
    try:
        yield engine
    finally:
        server.close()


@contextmanager
def blackholed_listener() -> Iterator[int]:
    """A port whose accept queue is full: further SYNs are dropped and connects hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


# ------------------------------------------------------------------ a simulated engine's KV events


@dataclass
class KvEventRecorder:
    """A `KvEventSink` keeping every batch of events, each event a tuple."""

    batches: list[list[tuple[object, ...]]] = field(default_factory=list)
    current: list[tuple[object, ...]] = field(default_factory=list)

    def stored(
        self,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None,
    ) -> None:
        event = ("stored", list(block_hashes), parent_block_hash, list(token_ids))
        self.current.append((*event, block_size, lora_name))

    def removed(self, block_hashes: Sequence[int]) -> None:
        self.current.append(("removed", list(block_hashes)))

    def cleared(self) -> None:
        self.current.append(("cleared",))

    def end_step(self) -> None:
        self.batches.append(self.current)
        self.current = []

    def events(self) -> list[tuple[object, ...]]:
        return [event for batch in self.batches for event in batch]

    def take(self) -> list[tuple[object, ...]]:
        """Every event so far, forgetting them."""
        events = self.events()
        self.batches.clear()
        return events


# ------------------------------------------------------------------ the metrics contract

# The metric families the README's metrics table promises, as named in the exposition
# format (counters with `_total`, histograms by their base name).
METRIC_LABELS: dict[str, frozenset[str]] = {
    "headcount_discovery_last_sync_timestamp_seconds": frozenset({"source"}),
    "headcount_discovery_watch_connected": frozenset({"source"}),
    "headcount_discovery_relists_total": frozenset({"source", "reason"}),
    "headcount_discovery_reconcile_removed_total": frozenset({"source"}),
    "headcount_engines": frozenset({"state"}),
    "headcount_requests_total": frozenset({"model", "code", "outcome"}),
    "headcount_request_duration_seconds": frozenset({"model"}),
    "headcount_time_to_first_byte_seconds": frozenset({"model"}),
    "headcount_upstream_failovers_total": frozenset({"reason"}),
    "headcount_engine_in_flight": frozenset({"engine"}),
    "headcount_outlier_ejections_total": frozenset({"reason"}),
    "headcount_outlier_ejected_engines": frozenset(),
    "headcount_local_resource_errors_total": frozenset({"resource"}),
    "headcount_task_restarts_total": frozenset({"task"}),
}
EXPORTED_METRICS = frozenset(METRIC_LABELS)
# With --routing kv-aware only: the engines' cache indexes.
KV_METRIC_LABELS: dict[str, frozenset[str]] = {
    "headcount_kv_index_state": frozenset({"engine", "state"}),
    "headcount_kv_index_blocks": frozenset({"engine"}),
    "headcount_kv_events_applied_total": frozenset({"engine"}),
    "headcount_kv_event_gaps_total": frozenset({"engine"}),
    "headcount_kv_replays_total": frozenset({"engine", "outcome"}),
    "headcount_kv_index_clears_total": frozenset({"engine", "reason"}),
    "headcount_kv_last_event_age_seconds": frozenset({"engine"}),
    "headcount_kv_predicted_cached_tokens_total": frozenset({"engine"}),
    "headcount_kv_engine_reported_hit_tokens_total": frozenset({"engine"}),
}
HISTOGRAMS = frozenset(
    {"headcount_request_duration_seconds", "headcount_time_to_first_byte_seconds"}
)
