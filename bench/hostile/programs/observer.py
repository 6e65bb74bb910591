"""The measuring client of the hostile suite: a loop-stall timer and normal traffic, side by side.

Run as `python -m bench.hostile.programs.observer --port P --until T --out F` (T on
CLOCK_MONOTONIC). Until T it keeps two things going against the router and
records each outcome with its start time, then waits (bounded by `--timeout`)
for the requests still in flight and writes one JSON object per line to F:

- the stall timer: `GET /livez` on one keep-alive connection every `--livez-every`
  seconds (the next one at once if an answer took longer), `{"k": "l", "t", "ms", "ok"}`;
  the router answers it itself, so its latency is the time its event loop takes to
  get to it;
- normal traffic: small chat completions for the healthy engine's model at a fixed
  `--rate`, each started on its tick whatever the earlier ones do (open loop: a
  stalled router cannot slow the traffic down and hide), over a pool of keep-alive
  connections (at most 4 kept idle), `{"k": "n", "t", "ms", "st", "id", "err"}`. Each carries
  `x-hostile-id: <id>` so an engine can tell which requests reached it;
- with `--big-rate`, chats whose prompt is 200 KB (larger than what the router parses
  on its loop, so each goes to a parse worker) at that rate, open loop too,
  `{"k": "b", ...}` as the small ones.

It connects from `--source` if given: a router that tells clients apart by address
(a fair share each) then sees it as a client of its own, apart from the attacks.
With `--api-key` every chat carries `Authorization: Bearer <key>`; `--livez-port`
sends the stall timer to another port (the router's `--admin-port`).

It runs in its own process so the attacks' work never delays its timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httptools
import uvloop

from bench.hostile.rawhttp import ConnectionClosed, RawConnection, get_request, post_request

__all__ = ["main"]

_LIVEZ = get_request("/livez")
BIG_PROMPT_BYTES = 200_000


def _chat(content: str) -> bytes:
    return json.dumps(
        {"model": "sim-model", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    ).encode()


_CHAT = _chat("hi")
_BIG_CHAT = _chat(("lorem ipsum dolor sit amet " * (BIG_PROMPT_BYTES // 27 + 1))[:BIG_PROMPT_BYTES])
_FAILURES = (ConnectionClosed, OSError, TimeoutError, httptools.HttpParserError)
_MAX_IDLE = 4
"""Keep-alive connections kept for reuse; the extra ones a stall made are closed after it,
so the router's open fds after an attack count the attack, not the observer's pool."""


class Observer:
    def __init__(
        self, host: str, port: int, timeout: float, tag: str, livez_port: int, key: str, source: str
    ) -> None:
        self.host, self.port, self.timeout, self.tag = host, port, timeout, tag
        self.source = source or None
        self.livez_port = livez_port
        self._auth = f"authorization: Bearer {key}\r\n".encode() if key else b""
        self.records: list[dict[str, object]] = []
        self._idle: list[RawConnection] = []

    async def livez(self, until: float, every: float) -> None:
        conn: RawConnection | None = None
        next_at = time.monotonic()
        while time.monotonic() < until:
            started = time.monotonic()
            ok = True
            try:
                if conn is None or conn.closed:
                    conn = await RawConnection.open(
                        self.host, self.livez_port, timeout=self.timeout, source=self.source
                    )
                await conn.send(_LIVEZ, self.timeout)
                answer = await conn.response(self.timeout)
                if not answer.keep_alive:
                    conn.close()
            except _FAILURES:
                ok = False
                if conn is not None:
                    conn.abort()
            elapsed_ms = (time.monotonic() - started) * 1000
            self.records.append({"k": "l", "t": started, "ms": elapsed_ms, "ok": ok})
            next_at = max(next_at + every, time.monotonic())
            await asyncio.sleep(next_at - time.monotonic())
        if conn is not None:
            conn.abort()

    async def traffic(self, until: float, rate: float, big: bool = False) -> None:
        if rate <= 0:
            return
        every = 1.0 / rate
        in_flight: set[asyncio.Task[None]] = set()
        number = 0
        next_at = time.monotonic()
        kind, body, tag = ("b", _BIG_CHAT, f"{self.tag}-big") if big else ("n", _CHAT, self.tag)
        while next_at < until:
            number += 1
            task = asyncio.create_task(self._chat(f"{tag}-{number}", kind, body))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            next_at += every
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        if in_flight:
            await asyncio.wait(in_flight, timeout=self.timeout + 5)

    def close(self) -> None:
        for conn in self._idle:
            conn.abort()

    async def _chat(self, request_id: str, kind: str, body: bytes) -> None:
        started = time.monotonic()
        deadline = started + self.timeout
        status, error = 0, ""
        conn: RawConnection | None = None
        try:
            conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = await RawConnection.open(
                    self.host, self.port, timeout=self.timeout, source=self.source
                )
            request = post_request(
                "/v1/chat/completions",
                body,
                b"x-hostile-id: %s\r\n%s" % (request_id.encode(), self._auth),
            )
            await conn.send(request, max(0.01, deadline - time.monotonic()))
            answer = await conn.response(max(0.01, deadline - time.monotonic()))
            status = answer.status
            if status != 200 or b'"choices"' not in answer.body:
                error = bytes(answer.body[:160]).decode(errors="replace")
            if answer.keep_alive and not conn.closed and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                conn = None
        except _FAILURES as exc:
            error = f"{type(exc).__name__}: {exc}"[:160]
        finally:
            if conn is not None:
                conn.close()
        self.records.append(
            {
                "k": kind,
                "t": started,
                "ms": (time.monotonic() - started) * 1000,
                "st": status,
                "id": request_id,
                "err": error,
            }
        )


async def _observe(args: argparse.Namespace) -> list[dict[str, object]]:
    observer = Observer(
        args.host,
        args.port,
        args.timeout,
        args.tag,
        args.livez_port or args.port,
        args.api_key,
        args.source,
    )
    await asyncio.gather(
        observer.livez(args.until, args.livez_every),
        observer.traffic(args.until, args.rate),
        observer.traffic(args.until, args.big_rate, big=True),
    )
    observer.close()
    return observer.records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--until", type=float, required=True, help="CLOCK_MONOTONIC seconds")
    parser.add_argument("--rate", type=float, default=50.0, help="normal requests per second")
    parser.add_argument("--livez-every", type=float, default=0.005, help="seconds")
    parser.add_argument("--livez-port", type=int, help="port of /livez (default: --port)")
    parser.add_argument("--api-key", default="", help="sent as a bearer key on every chat")
    parser.add_argument("--source", default="", help="local address to connect from")
    parser.add_argument("--big-rate", type=float, default=0.0, help="200 KB chats per second")
    parser.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    parser.add_argument("--tag", default="n", help="prefix of the x-hostile-id values")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    records = uvloop.run(_observe(args))
    with args.out.open("w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
