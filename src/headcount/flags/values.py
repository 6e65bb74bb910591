"""Flag values as people type them: durations with units, sizes, ports, and their defaults shown.

Shared by every command line, so `--probe-interval 250ms`, `--max-body-size
32MiB` and a help text's `(default 32MiB)` read and parse alike.
"""

from __future__ import annotations

import argparse
import re

__all__ = [
    "add_listen_arguments",
    "duration_help",
    "format_size",
    "parse_duration",
    "parse_port",
    "parse_size",
]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_FACTOR = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_duration(text: str) -> float:
    """Seconds from `1.5`, `1.5s`, `250ms`, `2m` or `1h`."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use seconds such as 2, 0.5, 250ms, 2m"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_size(text: str) -> int:
    """Bytes from `1048576`, `64KiB`, `32MiB`, `1G`."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use bytes such as 1048576, 32MiB")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * _SIZE_FACTOR[unit]


def parse_port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: use 0-65535")
    return port


def duration_help(what: str, default: float) -> str:
    """The one-line help of a duration flag: what it bounds, its units, its default."""
    return f"{what}; seconds or 250ms, 2m (default {default:g}s)"


def format_size(size: int) -> str:
    """`size` as `parse_size` reads it back, in the largest whole unit (`32MiB`)."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def add_listen_arguments(parser: argparse.ArgumentParser, host: str, port: int) -> None:
    """`--host` and `--port` of a simulator, which may pick a free port."""
    parser.add_argument("--host", default=host, help=f"address to listen on (default {host})")
    parser.add_argument(
        "--port",
        type=parse_port,
        default=port,
        help=f"port to listen on, 0: a free one (default {port})",
    )
