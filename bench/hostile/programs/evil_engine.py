"""An adversarial engine for the hostile suite: it answers a router as a broken or hostile one does.

It looks like a small vLLM engine (`/v1/models`, `/metrics`, chat completions)
until its mode is switched over `POST /_evil/mode {"mode": ..., "model": ...}`
(`GET /_evil/stats` tells what it saw; the admin paths answer in every mode):

- `healthy`: small, well-formed answers for `model`.
- `metrics`: `/metrics` is 100 MiB of vLLM gauge lines (all of them parsed by a router).
- `adapters`: `/v1/models` lists 200,000 LoRA adapters (about 30 MB of JSON).
- `nested`: `/v1/models` is JSON nested 100,000 deep (a recursive parser overflows).
- `header`: chat answers carry a 64 MiB header value.
- `desync`: chat answers carry a second, planted response (marker `PLANTED`), variant
  chosen by the request's `x-desync` header (1-4, else rotating): 1 two complete
  responses in one write; 2 an interim `100` with a content-length and the planted
  response as its "body", then a chunked 200; 3 a status 99 with the planted response
  as its body, then the 200; 4 as 3 with the 200 in a later write.
- `hang`: every request (probes too) is read and never answered; the connection is
  held until the mode changes. Chat requests' `x-hostile-id` values are recorded.
- `kv-huge`: healthy, and `/metrics` advertises a KV cache of 10**17 blocks of 1 token
  (`vllm:cache_config_info`): a router bounds its index of this engine by its own
  setting, or not at all.
- `tokenize-hang`: healthy, with zero load in `/metrics`, but `POST /tokenize` is read
  and never answered until the mode changes.

The big answers are built once, on first use. Run as
`python -m bench.hostile.programs.evil_engine --port P`; it serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable

import uvloop

from headcount.sim.engine.models import ModelCatalog

__all__ = ["MODES", "PLANTED", "main"]

MODES = (
    "healthy",
    "metrics",
    "adapters",
    "nested",
    "header",
    "desync",
    "hang",
    "kv-huge",
    "tokenize-hang",
)
HOLDING = ("hang", "tokenize-hang")
"""Modes that hold some requests unanswered until the mode changes."""
HUGE_BLOCKS = 10**17
PLANTED = b"PLANTED"
MIB = 1024 * 1024
METRICS_BYTES = 100 * MIB
ADAPTERS = 200_000
NESTING = 100_000
HEADER_BYTES = 64 * MIB
_HEAD_LIMIT = 1024 * 1024
_LATE_WRITE_S = 0.05
_CHAT_PATHS = (b"/v1/chat/completions", b"/v1/completions")


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _fields(body: bytes) -> bytes:
    """Everything after the status line: JSON header fields, the blank line, `body`."""
    return b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def _response(status: int, body: bytes) -> bytes:
    return b"HTTP/1.1 %d X\r\n%s" % (status, _fields(body))


def _models(model: str, adapters: int = 0) -> bytes:
    """`/v1/models` as the simulated engine lists it (vLLM's card shape), with `adapters`."""
    return ModelCatalog(model, 4096, [f"lora-{i:06d}" for i in range(adapters)]).body


def _chat_body(model: str) -> bytes:
    return _json(
        {
            "id": "chatcmpl-evil",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


def _gauges(model: str) -> bytes:
    labels = f'{{model_name="{model}"}}'
    return (
        f"vllm:num_requests_running{labels} 0.0\n"
        f"vllm:num_requests_waiting{labels} 0.0\n"
        f"vllm:kv_cache_usage_perc{labels} 0.0\n"
    ).encode()


def _huge_cache(model: str) -> bytes:
    return (
        _gauges(model)
        + (
            f'vllm:cache_config_info{{block_size="1",num_gpu_blocks="{HUGE_BLOCKS}"}} 1.0\n'
        ).encode()
    )


def _big_metrics(model: str) -> bytes:
    line = f'vllm:num_requests_running{{model_name="{model}",replica="0000000"}} 0.0\n'.encode()
    return line * (METRICS_BYTES // len(line))


def _many_adapters(model: str) -> bytes:
    return _models(model, ADAPTERS)


def _nested(model: str) -> bytes:
    return b'{"object":"list","data":' + b"[" * NESTING + b"]" * NESTING + b"}"


def _planted() -> bytes:
    return _response(200, _json({"object": "list", "data": [{"id": "PLANTED-by-evil-engine"}]}))


class Engine:
    """The mode, what was seen, and the answers (big ones built once per model)."""

    def __init__(self, model: str) -> None:
        self.mode = "healthy"
        self.model = model
        self.seen: Counter[str] = Counter()
        self.hung_ids: list[str] = []
        self.held = 0
        self._release = asyncio.Event()
        self._rotation = itertools.cycle((1, 2, 3, 4))
        self._cache: dict[tuple[str, str], bytes] = {}

    def set_mode(self, mode: str, model: str) -> None:
        if self.mode in HOLDING and mode != self.mode:
            self._release.set()
            self._release = asyncio.Event()
        self.mode, self.model = mode, model
        self.seen.clear()
        self.hung_ids.clear()

    def stats(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "model": self.model,
            "seen": dict(self.seen),
            "hung_ids": list(self.hung_ids),
            "held": self.held,
        }

    def _built(self, what: str, build: Callable[[str], bytes]) -> bytes:
        key = (what, self.model)
        if key not in self._cache:
            self._cache[key] = build(self.model)
        return self._cache[key]

    async def hold(self) -> None:
        """Never answer, until the mode changes."""
        self.held += 1
        try:
            await self._release.wait()
        finally:
            self.held -= 1

    async def answer(
        self, writer: asyncio.StreamWriter, path: bytes, headers: dict[bytes, bytes]
    ) -> None:
        mode = self.mode
        if path.startswith(b"/v1/models"):
            if mode == "adapters":
                body = self._built("adapters", _many_adapters)
            elif mode == "nested":
                body = self._built("nested", _nested)
            else:
                body = _models(self.model)
            writer.write(_response(200, body))
        elif path.startswith(b"/metrics"):
            if mode == "metrics":
                body = self._built("metrics", _big_metrics)
            elif mode == "kv-huge":
                body = _huge_cache(self.model)
            else:
                body = _gauges(self.model)
            writer.write(_response(200, body))
        elif path.startswith(_CHAT_PATHS):
            await self._chat(writer, headers)
        else:
            writer.write(_response(404, _json({"error": {"message": "not found"}})))
        await writer.drain()

    async def _chat(self, writer: asyncio.StreamWriter, headers: dict[bytes, bytes]) -> None:
        chat = _response(200, _chat_body(self.model))
        if self.mode == "header":
            value = self._built("header", lambda model: b"a" * HEADER_BYTES)
            fields = _fields(_chat_body(self.model))
            writer.writelines((b"HTTP/1.1 200 OK\r\nx-evil: ", value, b"\r\n", fields))
        elif self.mode == "desync":
            await self._desync(writer, headers, chat)
        else:
            writer.write(chat)

    async def _desync(
        self, writer: asyncio.StreamWriter, headers: dict[bytes, bytes], chat: bytes
    ) -> None:
        try:
            variant = int(headers.get(b"x-desync", b""))
        except ValueError:
            variant = next(self._rotation)
        planted = _planted()
        self.seen[f"desync-{variant}"] += 1
        if variant == 1:
            writer.write(chat + planted)
        elif variant == 2:
            body = _chat_body(self.model)
            chunked = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            chunked += b"transfer-encoding: chunked\r\n\r\n"
            chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            interim = b"HTTP/1.1 100 Continue\r\ncontent-length: %d\r\n\r\n" % len(planted)
            writer.write(interim + planted + chunked)
        else:
            early = b"HTTP/1.1 099 Early\r\ncontent-length: %d\r\n\r\n%s" % (len(planted), planted)
            if variant == 3:
                writer.write(early + chat)
            else:
                writer.write(early)
                await writer.drain()
                await asyncio.sleep(_LATE_WRITE_S)
                writer.write(chat)


async def _admin(engine: Engine, writer: asyncio.StreamWriter, path: bytes, body: bytes) -> None:
    if path == b"/_evil/mode":
        try:
            order = json.loads(body)
            mode, model = order["mode"], order.get("model", engine.model)
        except (ValueError, KeyError, TypeError):
            mode, model = "", ""
        if mode not in MODES:
            writer.write(_response(400, _json({"error": f"mode must be one of {MODES}"})))
        else:
            engine.set_mode(mode, model)
            writer.write(_response(200, _json(engine.stats())))
    else:
        writer.write(_response(200, _json(engine.stats())))
    await writer.drain()


def _parse_head(head: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    path = parts[1] if len(parts) > 1 else b"/"
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return path, headers


async def _connection(
    engine: Engine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path, headers = _parse_head(head)
            body = await reader.readexactly(int(headers.get(b"content-length", b"0") or 0))
            if path.startswith(b"/_evil/"):
                await _admin(engine, writer, path, body)
                continue
            engine.seen[path.split(b"?")[0].decode(errors="replace")] += 1
            if engine.mode == "tokenize-hang" and path.startswith(b"/tokenize"):
                await engine.hold()
                writer.transport.abort()
                return
            if engine.mode == "hang":
                if path.startswith(_CHAT_PATHS) and b"x-hostile-id" in headers:
                    engine.hung_ids.append(headers[b"x-hostile-id"].decode(errors="replace"))
                await engine.hold()
                writer.transport.abort()
                return
            await engine.answer(writer, path, headers)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def _serve(host: str, port: int, model: str) -> None:
    engine = Engine(model)
    server = await asyncio.start_server(
        lambda r, w: _connection(engine, r, w), host, port, limit=_HEAD_LIMIT, backlog=1024
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"evil engine on {host}:{port} at {time.monotonic():.3f}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="evil-model")
    args = parser.parse_args(argv)
    uvloop.run(_serve(args.host, args.port, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
