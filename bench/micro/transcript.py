"""What following a stream for resume costs: a micro-benchmark of `proxy/transcript.py`.

With `--stream-resume-limit` above 0 (the default), every streamed chat or
completion the router relays passes through a `Transcript`: `relay` per body
piece (an `endswith`, an append), and a fold of the kept events into their
text every 64 KiB (about 250 chunks), so a long stream holds its text, not
its chunks. This measures, on the simulated engine's chunks (shaped as
vLLM's), the cost per chunk of relaying a stream of `--tokens` tokens fed one
event a piece, folds included, and what reading it back costs when its engine
breaks at the end (`relayed`, once per resume). One process, `timeit`, best
of `--repeat` runs. The whole router's cost per request is
`python -m bench.overhead`'s to say.

Usage: `.venv/bin/python -m bench.micro.transcript [--tokens 2000] [--number N]`.
"""

from __future__ import annotations

import argparse
import time

from bench.micro.usage_tap import best_ns, stream_events
from headcount.proxy.transcript import Transcript

__all__ = ["main"]


def relay_all(events: list[bytes]) -> Transcript:
    transcript = Transcript()
    for event in events:
        transcript.relay(event)
    return transcript


def read_back(events: list[bytes], number: int) -> float:
    """Nanoseconds to read `number` relayed streams back, one `relayed` each."""
    transcripts = [relay_all(events) for _ in range(number)]
    started = time.perf_counter()
    for transcript in transcripts:
        transcript.relayed()
    return (time.perf_counter() - started) / number * 1e9


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.transcript")
    parser.add_argument("--tokens", type=int, default=2000, help="tokens in the stream")
    parser.add_argument("--number", type=int, default=20, help="streams per timing run")
    parser.add_argument("--repeat", type=int, default=5, help="timing runs (the best counts)")
    args = parser.parse_args(argv)
    events = stream_events(args.tokens)
    relay = best_ns(lambda: relay_all(events), args.number, args.repeat)
    read = min(read_back(events, args.number) for _ in range(args.repeat))
    size = sum(map(len, events))
    print(f"{args.tokens}-token chat stream, {len(events)} events, {size} bytes, one a piece")
    print(f"relay (folds included): {relay / len(events):8.0f} ns per event")
    print(f"read back on a failure: {read / 1000:8.1f} µs per stream")


if __name__ == "__main__":
    main()
