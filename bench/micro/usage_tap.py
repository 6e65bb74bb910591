"""What token accounting adds to one request: a micro-benchmark of `proxy/usage.py`.

For a tenant with token accounting the router pays `ask_usage` on a streamed
request's parsed body (one re-encoding when the client did not ask for
usage) and a `UsageTap` on the answer: `feed` per body piece, `end` once. This
measures them on the simulated engine's bodies (shaped as vLLM's): a 20-token
chat stream fed one event a piece, as vLLM writes them, with the usage event
dropped (the client did not ask) or forwarded (it did), and a 20-token chat
answer in one piece. One process, `timeit`, best of `--repeat` runs; with
`--instructions`, also valgrind's count of instructions per call (each case
run `--calls` and twice as many times, the difference divided), which a busy
machine does not move. It says nothing about the whole router's cost per
request; `python -m bench.overhead` and `python -m bench.micro.instructions` do.

Usage: `.venv/bin/python -m bench.micro.usage_tap [--tokens 20] [--number N] [--instructions]`.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import sys
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
_TOTAL = re.compile(r"I\s+refs:\s+([\d,]+)")


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


def cases(tokens: int) -> dict[str, tuple[Callable[[], object], int]]:
    """Each measured call by name, with how many times more often than a request it runs."""
    events = stream_events(tokens)
    chunk = events[1]
    answer = [chat_answer(tokens)]
    dropping = UsageTap(event_stream=True, drop_usage=True)
    forwarding = UsageTap(event_stream=True)
    return {
        "ask_usage, chat stream body": (functools.partial(ask_usage, BODY), 1),
        f"feed, one stream chunk ({len(chunk)} B), dropping": (
            functools.partial(dropping.feed, chunk),
            10,
        ),
        f"feed, one stream chunk ({len(chunk)} B), forwarding": (
            functools.partial(forwarding.feed, chunk),
            10,
        ),
        f"request, {tokens}-token stream, dropping usage": (
            functools.partial(whole_request, events, True, True),
            1,
        ),
        f"request, {tokens}-token stream, client asked": (
            functools.partial(whole_request, events, True, False),
            1,
        ),
        f"request, {tokens}-token chat answer ({len(answer[0])} B)": (
            functools.partial(whole_request, answer, False, False),
            1,
        ),
    }


def instructions(tokens: int, case: int, calls: int) -> float:
    """Instructions per call of case number `case`, counted by valgrind."""
    totals = []
    for count in (calls, 2 * calls):
        command = [
            *("valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"),
            *(sys.executable, "-m", "bench.micro.usage_tap", f"--tokens={tokens}"),
            *(f"--case={case}", f"--calls={count}"),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        total = _TOTAL.search(done.stderr)
        if total is None:
            raise SystemExit(f"no instruction count from valgrind:\n{done.stderr[-2000:]}")
        totals.append(int(total.group(1).replace(",", "")))
    return (totals[1] - totals[0]) / calls


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro.usage_tap", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--tokens", type=int, default=20, help="tokens in the answers")
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--instructions", action="store_true", help="count them (valgrind)")
    parser.add_argument("--calls", type=int, default=2000, help="calls counted by valgrind")
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)  # one case, untimed
    args = parser.parse_args()
    measured = cases(args.tokens)
    if args.case is not None:
        call, _ = list(measured.values())[args.case]
        for _ in range(args.calls):
            call()
        return
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found: apt-get install valgrind")
    width = max(map(len, measured))
    print(f"{'what':<{width}}  ns/call" + ("  instructions/call" if args.instructions else ""))
    for case, (name, (call, often)) in enumerate(measured.items()):
        ns = best_ns(call, args.number * often, args.repeat)
        counted = instructions(args.tokens, case, args.calls) if args.instructions else None
        print(f"{name:<{width}}  {ns:7.0f}" + ("" if counted is None else f"  {counted:17,.0f}"))


if __name__ == "__main__":
    main()
