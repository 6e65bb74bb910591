"""The streaming load: closed client loops, one streamed chat after another, each recorded.

Every loop sends a stream, reads it to its end, and sends the next: 64 loops
keep 64 streams open at all times, so every crash lands in the middle of some.
Each request has its own prompt (loop, number and seed as its last words: the
simulator's answer depends on the last three words, so no two answers are the
same) and its own `x-request-id`, which the router's log names. A loop stops by
itself at `until` or after `max_requests`, whichever comes first; a request
gives up after `timeout_s`.

Each stream is kept as a `Stream`: how it ended (`[DONE]`, broken, never
begun), its text, and the times its events arrived, read the moment aiohttp
hands over each line, so its largest gap is what a client sat through.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

__all__ = ["MODEL", "Load", "Stream", "request_body", "run_load"]

MODEL = "sim-model"
_DONE = b"data: [DONE]"
_FAILURE_PAUSE_S = 0.05
"""After a request that got no stream: a router failing fast is not hammered in a tight loop."""


@dataclass(frozen=True)
class Load:
    concurrency: int = 64
    max_tokens: int = 64
    timeout_s: float = 30.0
    """Per request: a stream that stalls is cut here."""
    seed: int = 1


def request_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    """The body sent for `prompt`: also what the expected answer is computed from."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }


@dataclass
class Stream:
    """One request and what its client saw. Times are `time.monotonic()`."""

    request_id: str
    prompt: str
    started: float
    ended: float = 0.0
    status: int = 0
    """The response's status; 0: none came."""
    done: bool = False
    """It ended with `data: [DONE]`."""
    error: str = ""
    """What broke it, or the error event the router sent; empty for a stream that ended well."""
    text: str = ""
    events: int = 0
    first_event: float = 0.0
    last_event: float = 0.0
    max_gap: float = 0.0
    """The largest time between two events (0 with fewer than two)."""
    gap_end: float = 0.0
    """When the event that ended the largest gap arrived: the first after a seam."""

    @property
    def kind(self) -> str:
        """`completed` (with `[DONE]`), `cut` (its 200 began, then it broke) or `failed`."""
        if self.status != 200:
            return "failed"
        return "completed" if self.done and not self.error else "cut"


def _event(stream: Stream, line: bytes, at: float) -> None:
    """Take one `data:` line, arrived at `at`, into `stream`."""
    if stream.events:
        gap = at - stream.last_event
        if gap > stream.max_gap:
            stream.max_gap, stream.gap_end = gap, at
    else:
        stream.first_event = at
    stream.events += 1
    stream.last_event = at
    try:
        chunk = json.loads(line[5:])
    except ValueError:
        stream.error = stream.error or f"unreadable event {line[:80]!r}"
        return
    if not isinstance(chunk, dict):
        return
    if "error" in chunk:
        stream.error = f"error event: {json.dumps(chunk['error'])[:160]}"
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str):
            stream.text += content


async def _read(session: aiohttp.ClientSession, url: str, body: dict[str, Any], s: Stream) -> None:
    headers = {"x-request-id": s.request_id}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as response:
        s.status = response.status
        if response.status != 200:
            s.error = f"{response.status} {(await response.read())[:160].decode(errors='replace')}"
            return
        async for line in response.content:
            if line.startswith(_DONE):
                s.done = True
            elif line.startswith(b"data:"):
                _event(s, line.rstrip(b"\r\n"), time.monotonic())
        if not s.done:
            s.error = s.error or f"ended after {s.events} events without [DONE]"


async def _one(
    session: aiohttp.ClientSession, url: str, load: Load, request_id: str, prompt: str
) -> Stream:
    stream = Stream(request_id, prompt, time.monotonic())
    try:
        async with asyncio.timeout(load.timeout_s):
            await _read(session, url, request_body(prompt, load.max_tokens), stream)
    except TimeoutError:
        stream.error = stream.error or f"no end within {load.timeout_s:g} s"
    except aiohttp.ClientPayloadError as exc:  # the error event, if one came, says more
        stream.error = stream.error or f"payload: {exc}"[:200]
    except (aiohttp.ClientError, OSError) as exc:
        stream.error = stream.error or f"{type(exc).__name__}: {exc}"[:200]
    stream.ended = time.monotonic()
    return stream


async def _loop(
    session: aiohttp.ClientSession,
    url: str,
    load: Load,
    index: int,
    until: float,
    max_requests: int,
    streams: list[Stream],
) -> None:
    for number in range(max_requests):
        if time.monotonic() >= until:
            return
        request_id = f"resume-{load.seed}-{index}-{number}"
        prompt = f"Tell the story of stream {index} {number} {load.seed}"
        stream = await _one(session, url, load, request_id, prompt)
        streams.append(stream)
        if stream.status != 200:
            await asyncio.sleep(_FAILURE_PAUSE_S)


async def run_load(
    url: str, load: Load, until: float, max_requests: int, streams: list[Stream]
) -> None:
    """`load.concurrency` loops against `url` until `until` (monotonic), each at most
    `max_requests` requests; every stream is appended to `streams` as it ends."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(
            *(
                _loop(session, url, load, index, until, max_requests, streams)
                for index in range(load.concurrency)
            )
        )
