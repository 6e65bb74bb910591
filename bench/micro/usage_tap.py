"""What token accounting adds to one request: a micro-benchmark of `proxy/usage.py`.

For a tenant with token accounting the router pays `ask_usage` on a streamed
request's parsed body (one re-encoding when the client did not ask for
usage) and a `UsageTap` on the answer: `feed` per body piece, `end` once. This
measures them on the simulated engine's bodies (shaped as vLLM's): a 20-token
chat stream fed one event a piece, as vLLM writes them, with the usage event
dropped (the client did not ask) or forwarded (it did), and a 20-token chat
answer in one piece. One process, `timeit`, best of `--repeat` runs. It says
nothing about the whole router's cost per request; `python -m bench.overhead`
and `python -m bench.micro.instructions` do.

Usage: `.venv/bin/python -m bench.micro.usage_tap [--tokens 20] [--number N]`.
"""

from __future__ import annotations

import argparse
import functools
import json
import timeit
from collections.abc import Callable

from headcount.proxy.usage import UsageTap, ask_usage
from headcount.sim.engine.parsing import Generation
from headcount.sim.engine.responses import completion_body, stream_head, usage_json

BODY = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "Say something long about token accounting."}],
    "max_tokens": 20,
    "stream": True,
}


def best_ns(call: Callable[[], object], number: int, repeat: int) -> float:
    """Nanoseconds per call, best of `repeat` runs of `number` calls."""
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e9


def stream_events(tokens: int) -> list[bytes]:
    generation = Generation("chat", "sim-model", True, tokens, True, list(range(40)))
    head, frames = stream_head(generation, "bench", "engine-a")
    chunks = [frames.chunk(index, index == tokens - 1) for index in range(tokens)]
    usage = head + b'"choices":[],"usage":' + usage_json(generation, None)
    return [*chunks, usage, b"data: [DONE]\n\n"]


def chat_answer(tokens: int) -> bytes:
    generation = Generation("chat", "sim-model", False, tokens, False, list(range(40)))
    body = completion_body(generation, "bench", "engine-a", None)
    return json.dumps(body, separators=(",", ":")).encode()


def whole_request(pieces: list[bytes], event_stream: bool, drop: bool) -> None:
    tap = UsageTap(event_stream=event_stream, drop_usage=drop)
    for piece in pieces:
        tap.feed(piece)
    tap.end()
    assert tap.completion_tokens is not None


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro.usage_tap", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--tokens", type=int, default=20, help="tokens in the answers")
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    number, repeat = args.number, args.repeat
    events = stream_events(args.tokens)
    chunk = events[1]
    answer = [chat_answer(args.tokens)]

    dropping = UsageTap(event_stream=True, drop_usage=True)
    passing = UsageTap(event_stream=True)
    rows = [
        ("ask_usage, chat stream body", best_ns(lambda: ask_usage(BODY), number, repeat)),
        (
            f"feed, one stream chunk ({len(chunk)} B), dropping",
            best_ns(functools.partial(dropping.feed, chunk), number * 10, repeat),
        ),
        (
            f"feed, one stream chunk ({len(chunk)} B), forwarding",
            best_ns(functools.partial(passing.feed, chunk), number * 10, repeat),
        ),
        (
            f"request, {args.tokens}-token stream, dropping usage",
            best_ns(lambda: whole_request(events, True, True), number, repeat),
        ),
        (
            f"request, {args.tokens}-token stream, client asked",
            best_ns(lambda: whole_request(events, True, False), number, repeat),
        ),
        (
            f"request, {args.tokens}-token chat answer ({len(answer[0])} B)",
            best_ns(lambda: whole_request(answer, False, False), number, repeat),
        ),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{'what':<{width}}  ns/call")
    for name, ns in rows:
        print(f"{name:<{width}}  {ns:7.0f}")


if __name__ == "__main__":
    main()
