"""What an API key check adds to one request: a micro-benchmark of the hot-path pieces.

With `--api-keys-file` (or keys in `--tenants-file`), every request pays
`ApiKeys.admits` (find the one `Authorization` header, one SHA-256 of the key,
one dict lookup of its digest); `ApiKeys.tenant` is the same lookup returning
the key's tenant, and `Credentials.tenant_of` what flow control asks of an open
router (no key: the default tenant). With keys or an engine key, `forward_headers`
drops the client's `Authorization` and adds the engine's. This measures each
on realistic header lists (an `openai` SDK request: 9 headers) beside the
same call without authentication, in one process with `timeit`, best of
`--repeat` runs. It says nothing about the whole router's cost per request;
`python -m bench.overhead` does.

Usage: `.venv/bin/python -m bench.micro.auth_check [--keys 1,10,100,1000] [--number N]`.
"""

from __future__ import annotations

import argparse
import functools
import timeit
from collections.abc import Callable

from headcount.auth import Credentials, parse_api_keys, parse_engine_key
from headcount.proxy.headers import forward_headers

KEY = "sk-bench-3f1c9e7a5b2d4c6e8f0a1b3c5d7e9f10"
HEADERS = [
    (b"host", b"router:8080"),
    (b"accept-encoding", b"gzip, deflate"),
    (b"connection", b"keep-alive"),
    (b"accept", b"application/json"),
    (b"content-type", b"application/json"),
    (b"user-agent", b"AsyncOpenAI/Python 1.99.0"),
    (b"x-stainless-lang", b"python"),
    (b"authorization", b"Bearer " + KEY.encode()),
    (b"content-length", b"96"),
]


def best_ns(call: Callable[[], object], number: int, repeat: int) -> float:
    """Nanoseconds per call, best of `repeat` runs of `number` calls."""
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro.auth_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--keys", default="1,10,100,1000", help="key counts to measure")
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    number, repeat = args.number, args.repeat

    rows: list[tuple[str, float]] = []
    for count in (int(n) for n in args.keys.split(",")):
        # The presented key is listed last in the file; the order does not matter.
        listed = "\n".join([*(f"sk-other-{n:06d}" for n in range(count - 1)), KEY])
        keys = parse_api_keys(listed)
        assert keys.admits(HEADERS)
        rows.append(
            (
                f"ApiKeys.admits, {count} key(s)",
                best_ns(functools.partial(keys.admits, HEADERS), number, repeat),
            )
        )
        rows.append(
            (
                f"ApiKeys.tenant, {count} key(s)",
                best_ns(functools.partial(keys.tenant, HEADERS), number, repeat),
            )
        )
    rows.append(
        (
            "Credentials.tenant_of, open",
            best_ns(functools.partial(Credentials().tenant_of, HEADERS), number, repeat),
        )
    )
    engine = parse_engine_key("sk-engine-key")
    rows.append(
        ("forward_headers, no auth", best_ns(lambda: forward_headers(HEADERS, 96), number, repeat))
    )
    rows.append(
        (
            "forward_headers, engine key",
            best_ns(lambda: forward_headers(HEADERS, 96, engine.header_line), number, repeat),
        )
    )
    width = max(len(name) for name, _ in rows)
    print(f"{'what':<{width}}  ns/call")
    for name, ns in rows:
        print(f"{name:<{width}}  {ns:7.0f}")


if __name__ == "__main__":
    main()
