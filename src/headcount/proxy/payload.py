"""What routing needs of a JSON request body: its `model`, and the affinity key a policy asks for.

`read_payload` is pure and the same wherever it runs: on the event loop for a
small body, or in a worker process for a large one (`parsepool.py`), where
`worker_main` is the child's whole program. The child loads this file by
path, not as `headcount.proxy.payload`: importing the `headcount.proxy`
package would pull the whole data plane into every worker's memory and start-up.
So this module imports nothing of headcount at import time; a key source is
named to the worker as `module:qualname` and imported there (`headcount.routing`
is light).

Outcomes are plain data that cross a pipe as JSON: `(model, key)` for a
routable body, else one of the codes below, which `admission.py` turns into
answers. Malformed JSON is `invalid_json`, JSON nested deeper than the parser's
recursion bound is `too_deep`, a string holding a lone UTF-16 surrogate (valid
JSON, `"\\ud800"`, yet no text that UTF-8 or a tokenizer can encode) is
`invalid_unicode` (all 400, never a 500 with a traceback); a body whose parse
runs out of the worker's memory bound is `too_complex`.
"""

from __future__ import annotations

import importlib
import json
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

__all__ = [
    "INTERNAL",
    "INVALID_JSON",
    "INVALID_UNICODE",
    "MISSING_MODEL",
    "NOT_AN_OBJECT",
    "TOO_COMPLEX",
    "TOO_DEEP",
    "UNAVAILABLE",
    "Outcome",
    "decode_outcome",
    "encode_request",
    "key_source_name",
    "parse_request",
    "read_payload",
    "worker_main",
]

INVALID_JSON = "invalid_json"
TOO_DEEP = "too_deep"
INVALID_UNICODE = "invalid_unicode"
NOT_AN_OBJECT = "not_an_object"
MISSING_MODEL = "missing_model"
TOO_COMPLEX = "too_complex"
"""The parse needed more memory than a worker may use (pathological structure)."""
UNAVAILABLE = "unavailable"
"""No worker could read the body (it died, or none could be started)."""
INTERNAL = "internal"
"""A bug while reading (a key source raised): the client gets a plain 500."""

Outcome = tuple[str, str | None] | str
"""`(model, key)`, or one of the codes above."""

_KeySource = Callable[[Mapping[str, Any], Callable[[bytes], bytes | None]], str | None]
_FRAME = struct.Struct("!II")
"""A request to a worker: metadata length, body length; then the metadata JSON, the body."""
_LENGTH = struct.Struct("!I")
"""An answer from a worker: its length, then the outcome as JSON."""


def read_payload(
    body: bytes, key_source: _KeySource | None, header: Callable[[bytes], bytes | None]
) -> Outcome:
    """`(model, key)` from a JSON body, or why it cannot be routed."""
    payload = parse_request(body)
    if isinstance(payload, str):
        return payload
    key = key_source(payload, header) if key_source is not None else None
    return payload["model"], key


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""The C scanner `json.loads` ends in (set by `JSONDecoder.__init__`, unknown to typeshed)."""


def _loads(body: bytes) -> tuple[Any, bool]:
    """`json.loads(body)`, without its per-call layers for the common body: plain UTF-8 text
    of one JSON value with nothing around it (0.7 instead of 1.9 µs for a small chat body).
    Anything else (another encoding, a BOM, whitespace around, invalid) gets `json.loads`'s
    own verdict. Beside the value: whether a string in it may hold a lone surrogate, which
    only a `\\ud...` escape can put in plain UTF-8 text (the decode refuses one as bytes);
    a body in another encoding is not looked into, and may."""
    try:
        text = body.decode()
        value, end = _SCAN(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return json.loads(body), True
    if end != len(text):
        return json.loads(body), True
    return value, "\\u" in text and ("\\ud" in text or "\\uD" in text)


def parse_request(body: bytes) -> dict[str, Any] | str:
    """The JSON object of a body, with a non-empty string `model`, or why it is not one."""
    try:
        payload, suspect = _loads(body)
    except RecursionError:
        return TOO_DEEP
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return INVALID_JSON
    if not isinstance(payload, dict):
        return NOT_AN_OBJECT
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        return MISSING_MODEL
    if suspect:
        return _text_problem(payload) or payload
    return payload


def _text_problem(payload: dict[str, Any]) -> str | None:
    """Why a string in `payload` is no UTF-8 text, if one is not. Only a body `_loads` says
    may hold a surrogate pays for this walk; a surrogate pair decodes to one character and
    passes."""
    try:
        json.dumps(payload, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return INVALID_UNICODE
    except RecursionError:
        return TOO_DEEP
    return None


def key_source_name(key_source: _KeySource) -> str | None:
    """`module:qualname` under which a worker can import `key_source`, or None if it cannot."""
    module = getattr(key_source, "__module__", None)
    qualname = getattr(key_source, "__qualname__", "")
    if not module or "<" in qualname:
        return None
    try:
        return module + ":" + qualname if _resolve(module, qualname) is key_source else None
    except (ImportError, AttributeError):
        return None


def encode_request(
    body: bytes, key_source: str | None, headers: Sequence[tuple[bytes, bytes]]
) -> tuple[bytes, bytes]:
    """The frame head and metadata for one request to a worker (the body follows them)."""
    meta = json.dumps(
        {
            "key": key_source,
            "headers": [[n.decode("latin-1"), v.decode("latin-1")] for n, v in headers]
            if key_source
            else [],
        }
    ).encode()
    return _FRAME.pack(len(meta), len(body)), meta


def decode_outcome(data: bytes) -> Outcome:
    value = json.loads(data)
    if isinstance(value, list):
        return str(value[0]), None if value[1] is None else str(value[1])
    return str(value)


def _resolve(module: str, qualname: str) -> Any:
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


# -- the worker process -----------------------------------------------------------------------


def worker_main() -> None:
    """A worker's whole life: read frames from stdin, answer each with its outcome on stdout.

    argv[1] is how many bytes of address space parsing may add to the worker's own
    (0: no bound): a hostile body of empty arrays costs ~30 times its size in Python
    objects, and running out here is a `too_complex` answer, not an OOM-killed pod.
    Ends quietly when the router closes the pipe.
    """
    _bound_memory(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sources: dict[str, _KeySource | None] = {}
    try:
        while True:
            head = _read_exactly(stdin, _FRAME.size)
            if head is None:
                return
            meta_size, body_size = _FRAME.unpack(head)
            meta = json.loads(_read_exactly(stdin, meta_size) or b"{}")
            body = _read_exactly(stdin, body_size) or b""
            answer = json.dumps(_outcome(body, meta, sources)).encode()
            del body
            stdout.write(_LENGTH.pack(len(answer)) + answer)
            stdout.flush()
    except (KeyboardInterrupt, BrokenPipeError):
        return


def _outcome(body: bytes, meta: dict[str, Any], sources: dict[str, _KeySource | None]) -> Any:
    name = meta.get("key")
    key_source = None
    if name:
        if name not in sources:
            sources[name] = _resolve(*name.split(":", 1))
        key_source = sources[name]
    headers = {n.encode("latin-1"): v.encode("latin-1") for n, v in reversed(meta["headers"])}
    try:
        return read_payload(body, key_source, headers.get)
    except MemoryError:
        return TOO_COMPLEX
    except Exception:
        return INTERNAL


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size) if size else b""
    return data if len(data) == size else None


def _bound_memory(extra: int) -> None:
    if extra <= 0:
        return
    try:
        import resource

        with open("/proc/self/status", "rb") as status:
            fields = dict(line.split(b":", 1) for line in status if b":" in line)
        vm_size = int(fields[b"VmSize"].split()[0]) * 1024
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        soft = vm_size + extra if hard == resource.RLIM_INFINITY else min(vm_size + extra, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except (OSError, ValueError, KeyError, ImportError):
        print("headcount body parser: memory not bounded", file=sys.stderr)
