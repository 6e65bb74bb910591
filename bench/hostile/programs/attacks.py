"""The hostile clients of the hostile suite, each a bounded attack on a router through its port.

Run as `python -m bench.hostile.programs.attacks ATTACK --port P --start-at T0 --stop-at T1 --out F`
(times on CLOCK_MONOTONIC, shared by every process on the machine): payloads are
built first, the attack starts at T0, every socket is closed by T1, and a JSON
summary of what the attacker saw (answers, bytes sent, connections the router
closed) is written to F. Attacks:

- `json-bodies`: `clients` connections each POST 31 MiB JSON bodies of nested empty
  arrays with an unknown model (named last, so finding it takes the whole body),
  back to back; the first body of each is 100,000 arrays deep instead.
- `chunk-waves`: waves of `clients` connections; each sends the same 31 MiB body in
  2-byte chunks (`transfer-encoding: chunked`, written in 256 KiB slices, so the
  kernel coalesces them as it would), never the last chunk, then disconnects at the
  end of its wave (`waves` of them share the attack). Body bytes sent are counted
  per wave: what the router held at most.
- `pipeline`: `connections` connections write pipelined `GET /v1/models` as fast as
  the router takes them and never read a byte.
- `slowloris`: `connections` connections each send a request head, one byte per
  second.
- `idle`: `connections` connections opened and left silent.
- `evil-requests`: `clients` connections send chat requests for the adversarial
  engine's model, back to back (its answers are what attacks the router).
- `desync`: `clients` loops, each on a fresh connection: a chat request for the
  adversarial engine's model (variant `x-desync: 1..4`), then `GET /v1/models` on the
  same connection, which only the router answers: a response holding `PLANTED`, or a
  second answer that is not the router's model list, is a desync.
- `wide-bodies`: `json-bodies` without the deep first body: 31 MiB of `[],` each, back
  to back, all for the parse workers.
- `keyless-heads`: `connections` connections on the port (and as many on `--also-port`,
  the admin port) each send a POST head without a key declaring `content-length:
  33554432`, never a body byte; one closed or answered is opened again at once.
- `unroutable-chats`: `clients` connections send `count` distinct chats in all, each
  body 32 KiB (random words; as large as a router tokenizes on its loop), for a model
  nobody serves, back to back.
- `kv-frames`, `kv-flood`, `kv-index`: an adversarial KV-event publisher instead of a client
  (`bench/hostile/programs/kv_attacks.py` says what they send).

Every attack lives here, over 450 lines, so that one runner and one command line
start any of them and the catalogue reads in one place.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import httptools
import uvloop

from bench.hostile.programs.kv_attacks import kv_flood, kv_frames, kv_index
from bench.hostile.programs.plan import Plan, Stats, error_name, wait_start
from bench.hostile.rawhttp import (
    ConnectionClosed,
    RawConnection,
    RawResponse,
    get_request,
    post_request,
)

__all__ = ["ATTACKS", "Plan", "nested_arrays_body", "two_byte_chunks"]

MIB = 1024 * 1024
BODY_BYTES = 31 * MIB
DECLARED_BYTES = 32 * MIB
"""What a keyless head declares: the router's default body limit, all of it."""
UNROUTABLE_BYTES = 32 * 1024
DEPTH = 100_000
CHAT = "/v1/chat/completions"
UNKNOWN_MODEL = "no-such-model"
EVIL_MODEL = "evil-model"
PLANTED = b"PLANTED"
_SLICE = 256 * 1024
_PIPELINE_BLOCK = 256
_OPEN_CONCURRENCY = 100
_ERROR_PAUSE_S = 0.05
"""After a failed connect or a broken connection: no hot loop against a refusing router."""
_SLOW_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: slow\r\ncontent-type: application/json\r\n"
    + b"x-slow: "
    + b"a" * 4096
)
_SLOW_TICKS = 10
"""Slowloris writes to a tenth of its connections every tenth of a second."""


def nested_arrays_body(size: int, model: str = UNKNOWN_MODEL) -> bytes:
    """`{"x":[[],[],...],"model":...}` of about `size` bytes: millions of empty lists to parse."""
    head, tail = b'{"x":[', b'[]],"model":"%s"}' % model.encode()
    count = max(0, (size - len(head) - len(tail)) // 3)
    return head + b"[]," * count + tail


def deep_body(depth: int, model: str = UNKNOWN_MODEL) -> bytes:
    return b'{"x":' + b"[" * depth + b"]" * depth + b',"model":"%s"}' % model.encode()


def two_byte_chunks(body: bytes) -> bytes:
    """`body` framed as chunks of 2 bytes each (`2\\r\\nxx\\r\\n`), without the last chunk.

    Built from a 6-byte period of `body`'s `[],[],` run, so a 31 MiB body takes no
    Python loop per chunk; the short head and tail are framed one by one.
    """
    head_end = body.index(b"[]") if b"[]" in body else len(body)
    head_end -= head_end % 2
    run_end = body.rindex(b"[],") + 3 if b"[]," in body else head_end
    period = body[head_end : head_end + 6]
    repeats = max(0, run_end - head_end) // 6
    tail = body[head_end + 6 * repeats :]

    def frame(part: bytes) -> bytes:
        return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in _pieces(part, 2))

    return frame(body[:head_end]) + frame(period) * repeats + frame(tail)


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --- json-bodies ----------------------------------------------------------------


async def json_bodies(plan: Plan, deep_first: bool = True) -> Stats:
    wide = post_request(CHAT, nested_arrays_body(BODY_BYTES))
    deep = post_request(CHAT, deep_body(DEPTH))
    answers: Counter[str] = Counter()
    await wait_start(plan)

    async def client() -> None:
        conn: RawConnection | None = None
        request, kind = (deep, "deep") if deep_first else (wide, "31 MiB")
        while plan.running():
            try:
                if conn is None or conn.closed:
                    conn = await RawConnection.open(plan.host, plan.port, timeout=plan.remaining())
                await conn.send(request, plan.remaining())
                answer = await conn.response(plan.remaining())
                answers[f"{kind} body: {answer.status}"] += 1
                if not answer.keep_alive:
                    conn.close()
            except TimeoutError:
                answers[f"{kind} body: still unanswered at the end"] += 1
            except (ConnectionClosed, OSError, httptools.HttpParserError) as exc:
                answers[f"{kind} body: {error_name(exc)}"] += 1
                if conn is not None:
                    conn.abort()
                await asyncio.sleep(_ERROR_PAUSE_S)
            request, kind = wide, "31 MiB"
        if conn is not None:
            conn.abort()

    await asyncio.gather(*(client() for _ in range(plan.clients)))
    return {"answers": dict(answers), "uploaders": plan.clients}


async def wide_bodies(plan: Plan) -> Stats:
    """`json-bodies` without the deep first body: only the parse workers' time is taken."""
    return await json_bodies(plan, deep_first=False)


# --- chunk-waves ----------------------------------------------------------------


async def chunk_waves(plan: Plan) -> Stats:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\n"
        b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    wire = memoryview(two_byte_chunks(nested_arrays_body(BODY_BYTES)))
    await wait_start(plan)
    span = (plan.stop_at - plan.start_at) / plan.waves
    sent: list[int] = []
    per_wave: list[float] = []
    outcomes: Counter[str] = Counter()

    async def upload(wave_end: float) -> None:
        written = 0
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(plan.host, plan.port),
                max(0.01, wave_end - time.monotonic()),
            )
        except (OSError, TimeoutError) as exc:
            outcomes[f"connect: {error_name(exc)}"] += 1
            return
        try:
            writer.write(head)
            for offset in range(0, len(wire), _SLICE):
                writer.write(wire[offset : offset + _SLICE])
                await asyncio.wait_for(writer.drain(), max(0.01, wave_end - time.monotonic()))
                written += min(_SLICE, len(wire) - offset)
            outcomes["whole body sent (last chunk withheld)"] += 1
        except TimeoutError:
            outcomes["disconnected mid-body at the wave's end"] += 1
        except (ConnectionError, OSError) as exc:
            outcomes[f"router closed: {error_name(exc)}"] += 1
        finally:
            sent.append(written)
            writer.close()

    for wave in range(plan.waves):
        wave_end = plan.start_at + (wave + 1) * span
        before = sum(sent)
        await asyncio.gather(*(upload(wave_end) for _ in range(plan.clients)))
        per_wave.append(round((sum(sent) - before) * 2 / 7 / MIB, 1))
    return {
        "waves": plan.waves,
        "uploaders": plan.clients,
        "body MiB sent per wave": per_wave,
        "max body MiB sent by one upload": round(max(sent, default=0) * 2 / 7 / MIB, 2),
        "outcomes": dict(outcomes),
    }


# --- connections that write, or only hold -------------------------------------------


class _Tracked(asyncio.Protocol):
    """A connection whose bytes received and end are counted; can stop reading at once."""

    def __init__(self, read: bool = True) -> None:
        self._read = read
        self.transport: asyncio.Transport | None = None
        self.received = 0
        self.lost_at: float | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self._read:
            transport.pause_reading()  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.received += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost_at = time.monotonic()
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def writable(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._writable.wait(), timeout)
        except TimeoutError:
            return False
        return self.lost_at is None


async def _open_many(plan: Plan, count: int, read: bool) -> tuple[list[_Tracked], Counter[str]]:
    loop = asyncio.get_running_loop()
    limit = asyncio.Semaphore(_OPEN_CONCURRENCY)
    opened: list[_Tracked] = []
    errors: Counter[str] = Counter()

    async def one() -> None:
        async with limit:
            if not plan.running():
                return
            try:
                _, protocol = await asyncio.wait_for(
                    loop.create_connection(lambda: _Tracked(read), plan.host, plan.port),
                    plan.remaining(),
                )
            except (OSError, TimeoutError) as exc:
                errors[error_name(exc)] += 1
                return
            opened.append(protocol)

    await asyncio.gather(*(one() for _ in range(count)))
    return opened, errors


def _closed_by_router(conns: list[_Tracked], before: float) -> int:
    return sum(1 for c in conns if c.lost_at is not None and c.lost_at < before)


def _close_all(conns: list[_Tracked]) -> None:
    for conn in conns:
        if conn.transport is not None:
            conn.transport.abort()


async def pipeline(plan: Plan) -> Stats:
    block = get_request("/v1/models") * _PIPELINE_BLOCK
    await wait_start(plan)
    conns, errors = await _open_many(plan, plan.connections, read=False)
    written = 0

    async def push(conn: _Tracked) -> None:
        nonlocal written
        assert conn.transport is not None
        while plan.running() and conn.lost_at is None:
            conn.transport.write(block)
            written += _PIPELINE_BLOCK
            if not await conn.writable(plan.remaining()):
                break

    await asyncio.gather(*(push(conn) for conn in conns))
    end = time.monotonic()
    closed = _closed_by_router(conns, end)
    _close_all(conns)
    return {
        "connections": len(conns),
        "requests written (never read)": written,
        "closed by the router": closed,
        "connect errors": dict(errors),
    }


async def slowloris(plan: Plan) -> Stats:
    await wait_start(plan)
    conns, errors = await _open_many(plan, plan.connections, read=True)
    position = [0] * len(conns)
    tick = 0
    while plan.running():
        for index in range(tick % _SLOW_TICKS, len(conns), _SLOW_TICKS):
            conn = conns[index]
            if conn.lost_at is None and conn.transport is not None:
                byte = position[index] % len(_SLOW_HEAD)
                conn.transport.write(_SLOW_HEAD[byte : byte + 1])
                position[index] += 1
        tick += 1
        await asyncio.sleep(min(1.0 / _SLOW_TICKS, plan.remaining()))
    end = time.monotonic()
    stats: Stats = {
        "connections": len(conns),
        "head bytes sent": sum(position),
        "closed by the router": _closed_by_router(conns, end),
        "answered bytes": sum(c.received for c in conns),
        "connect errors": dict(errors),
    }
    _close_all(conns)
    return stats


async def idle(plan: Plan) -> Stats:
    await wait_start(plan)
    opened_from = time.monotonic()
    conns, errors = await _open_many(plan, plan.connections, read=True)
    opened_s = time.monotonic() - opened_from
    await asyncio.sleep(plan.remaining())
    stats: Stats = {
        "connections": len(conns),
        "seconds to open them": round(opened_s, 2),
        "closed by the router": _closed_by_router(conns, time.monotonic()),
        "connect errors": dict(errors),
    }
    _close_all(conns)
    return stats


# --- what a client without a key can take -------------------------------------------------

_KEYLESS_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n" % DECLARED_BYTES
)


async def keyless_heads(plan: Plan) -> Stats:
    """`connections` connections on each port, each a keyless POST head declaring 32 MiB and
    never a byte of body; one the router closes (or answers) is opened again at once."""
    ports = [plan.port] + ([plan.also_port] if plan.also_port else [])
    answers: dict[int, Counter[str]] = {port: Counter() for port in ports}
    opened: Counter[int] = Counter()
    await wait_start(plan)

    async def hold(port: int) -> None:
        while plan.running():
            try:
                conn = await RawConnection.open(plan.host, port, timeout=plan.remaining())
            except (OSError, TimeoutError) as exc:
                answers[port][f"connect: {error_name(exc)}"] += 1
                await asyncio.sleep(_ERROR_PAUSE_S)
                continue
            opened[port] += 1
            held_from = time.monotonic()
            try:
                await conn.send(_KEYLESS_HEAD, plan.remaining())
                answer = await conn.response(plan.remaining())
                answers[port][f"answered {answer.status}"] += 1
            except TimeoutError:
                answers[port]["held to the end, unanswered"] += 1
            except (ConnectionClosed, OSError, httptools.HttpParserError) as exc:
                held = time.monotonic() - held_from
                answers[port][f"closed unanswered after {held:.0f} s: {error_name(exc)}"] += 1
            finally:
                conn.abort()
            await asyncio.sleep(_ERROR_PAUSE_S if plan.running() else 0.0)

    await asyncio.gather(*(hold(port) for port in ports for _ in range(plan.connections)))
    return {
        "heads per port": plan.connections,
        "declared MiB each": DECLARED_BYTES / MIB,
        "by port": {
            ("data" if port == plan.port else "admin"): {
                "connections opened": opened[port],
                "outcomes": dict(answers[port]),
            }
            for port in ports
        },
    }


# --- tokenizing what nobody serves -----------------------------------------------------------


def _distinct_chat(rng: random.Random, words: list[str], size: int) -> bytes:
    """A chat body of at most `size` bytes (the most a router tokenizes on its loop), of words
    no other chat repeats in that order."""
    shell = {"model": UNKNOWN_MODEL, "messages": [{"role": "user", "content": ""}]}
    room = size - len(json.dumps(shell))
    text = " ".join(rng.choices(words, k=room // 5))[:room]
    shell["messages"][0]["content"] = text
    return json.dumps(shell).encode()


async def unroutable_chats(plan: Plan) -> Stats:
    """`clients` connections send `count` distinct 32 KiB chats in all for a model nobody
    serves, back to back (each built just before it is sent)."""
    rng = random.Random(17)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(20_000)]
    answers: Counter[str] = Counter()
    sent = 0
    await wait_start(plan)

    async def client() -> None:
        nonlocal sent
        conn: RawConnection | None = None
        while plan.running() and sent < plan.count:
            sent += 1
            request = post_request(CHAT, _distinct_chat(rng, words, UNROUTABLE_BYTES))
            try:
                if conn is None or conn.closed:
                    conn = await RawConnection.open(plan.host, plan.port, timeout=plan.remaining())
                await conn.send(request, plan.remaining())
                answer = await conn.response(plan.remaining())
                answers[str(answer.status)] += 1
                if not answer.keep_alive:
                    conn.close()
            except TimeoutError:
                answers["still unanswered at the end"] += 1
            except (ConnectionClosed, OSError, httptools.HttpParserError) as exc:
                answers[error_name(exc)] += 1
                if conn is not None:
                    conn.abort()
                await asyncio.sleep(_ERROR_PAUSE_S)
        if conn is not None:
            conn.abort()

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(plan.clients)))
    return {
        "chats sent": sent,
        "KiB each": UNROUTABLE_BYTES // 1024,
        "seconds": round(time.monotonic() - started, 1),
        "answers": dict(answers),
    }


# --- requests the adversarial engine answers --------------------------------------------


_EVIL_CHAT = json.dumps(
    {"model": EVIL_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
).encode()


async def evil_requests(plan: Plan) -> Stats:
    answers: Counter[str] = Counter()
    slowest = 0.0
    header_mib = 0.0
    await wait_start(plan)

    async def client() -> None:
        nonlocal slowest, header_mib
        while plan.running():
            started = time.monotonic()
            conn: RawConnection | None = None
            try:
                conn = await RawConnection.open(
                    plan.host, plan.port, timeout=plan.remaining(), keep=1024
                )
                await conn.send(post_request(CHAT, _EVIL_CHAT), plan.remaining())
                answer = await conn.response(plan.remaining())
                answers[str(answer.status)] += 1
                header_mib = max(header_mib, answer.header_bytes / MIB)
            except TimeoutError:
                answers["still unanswered at the end"] += 1
            except (ConnectionClosed, OSError, httptools.HttpParserError) as exc:
                answers[error_name(exc)] += 1
                await asyncio.sleep(_ERROR_PAUSE_S)
            finally:
                if conn is not None:
                    conn.abort()
            slowest = max(slowest, time.monotonic() - started)

    await asyncio.gather(*(client() for _ in range(plan.clients)))
    return {
        "answers": dict(answers),
        "slowest answer s": round(slowest, 2),
        "largest header MiB relayed": round(header_mib, 1),
    }


_DESYNCED = ("planted", "foreign", "garbled")
"""Outcomes where the client connection no longer carries one answer per request."""


def _own_model_list(answer: RawResponse) -> bool:
    return answer.status == 200 and b'"object":"list"' in answer.body.replace(b" ", b"")


async def _desync_once(plan: Plan, variant: int) -> str:
    conn: RawConnection | None = None
    try:
        conn = await RawConnection.open(plan.host, plan.port, timeout=plan.remaining())
        chat = post_request(CHAT, _EVIL_CHAT, b"x-desync: %d\r\n" % variant)
        await conn.send(chat, plan.remaining())
        first = await conn.response(plan.remaining())
        if PLANTED in first.body:
            return "planted response relayed as the answer"
        if not first.keep_alive or conn.closed:
            return f"{first.status}, then closed"
        await conn.send(get_request("/v1/models"), plan.remaining())
        second = await conn.response(plan.remaining())
    except TimeoutError:
        return "unanswered"
    except ConnectionClosed:
        return "closed by the router"
    except httptools.HttpParserError:
        return "garbled bytes on the connection"
    except OSError as exc:
        return error_name(exc)
    finally:
        if conn is not None:
            conn.abort()
    if PLANTED in second.body:
        return "planted response answered the next request"
    if not _own_model_list(second):
        return f"next request got a foreign {second.status}"
    return f"clean ({first.status})"


async def desync(plan: Plan) -> Stats:
    outcomes: dict[int, Counter[str]] = {variant: Counter() for variant in (1, 2, 3, 4)}
    await wait_start(plan)

    async def client(offset: int) -> None:
        attempt = offset
        while plan.running():
            variant = attempt % 4 + 1
            outcomes[variant][await _desync_once(plan, variant)] += 1
            attempt += 1

    await asyncio.gather(*(client(i) for i in range(plan.clients)))
    planted = sum(
        count
        for counter in outcomes.values()
        for outcome, count in counter.items()
        if any(word in outcome for word in _DESYNCED)
    )
    return {
        "desynced answers": planted,
        "by variant": {f"variant {v}": dict(counter) for v, counter in outcomes.items()},
    }


# --- running one ------------------------------------------------------------------


ATTACKS: dict[str, Callable[[Plan], Awaitable[Stats]]] = {
    "json-bodies": json_bodies,
    "wide-bodies": wide_bodies,
    "keyless-heads": keyless_heads,
    "unroutable-chats": unroutable_chats,
    "kv-frames": kv_frames,
    "kv-flood": kv_flood,
    "kv-index": kv_index,
    "chunk-waves": chunk_waves,
    "pipeline": pipeline,
    "slowloris": slowloris,
    "idle": idle,
    "evil-requests": evil_requests,
    "desync": desync,
}
_OVERRUN_S = 5.0
"""An attack still running this long after its stop time is cancelled (its sockets close)."""


async def _run(name: str, plan: Plan) -> Stats:
    bound = plan.stop_at - time.monotonic() + _OVERRUN_S
    try:
        return await asyncio.wait_for(ATTACKS[name](plan), bound)
    except TimeoutError:
        return {"error": f"did not end within {_OVERRUN_S:g} s of its stop time"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("attack", choices=sorted(ATTACKS))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--start-at", type=float, required=True)
    parser.add_argument("--stop-at", type=float, required=True)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--also-port", type=int, help="a second port attacked alike")
    parser.add_argument("--count", type=int, default=0, help="requests in all")
    parser.add_argument("--kv-endpoint", default="", help="KV-event PUB socket to bind")
    parser.add_argument("--replay-endpoint", default="", help="KV-event replay socket to bind")
    parser.add_argument("--sizes-mib", default="", help="comma list: large KV-event frames")
    parser.add_argument("--blocks", type=int, default=0, help="blocks a KV publisher stores")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    _raise_fd_limit()
    plan = Plan(
        args.host,
        args.port,
        args.start_at,
        args.stop_at,
        args.clients,
        max(1, args.waves),
        args.connections,
        also_port=args.also_port,
        count=args.count,
        kv_endpoint=args.kv_endpoint,
        replay_endpoint=args.replay_endpoint,
        sizes_mib=tuple(float(size) for size in args.sizes_mib.split(",") if size),
        blocks=args.blocks,
    )
    stats = uvloop.run(_run(args.attack, plan))
    args.out.write_text(json.dumps(stats, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
