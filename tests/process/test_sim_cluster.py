"""The simulated-cluster harness's client and traffic, against a scripted router stand-in.

Scenario tests, the demo and the benchmarks trust `headcount.sim.cluster` to
count what their traffic saw and to read the router's endpoints; a scripted
server stands in for the router where exact answers are needed. The flags and
the wait are tests/unit/test_sim_cluster.py.
"""

from __future__ import annotations

import json

import pytest

from headcount.sim.cluster import RouterClient, steady_traffic, wait_until
from tests.support import EngineConnection, raw_engine

__all__: list[str] = []

# ------------------------------------------------------------------ a router stand-in

METRICS = (
    b"# TYPE headcount_upstream_failovers counter\n"
    b'headcount_upstream_failovers_total{reason="connect_failed"} 2.0\n'
    b'headcount_upstream_failovers_total{reason="http_503"} 3.0\n'
    b'headcount_upstream_failovers_created{reason="http_503"} 1.7e+09\n'
    b"headcount_upstream_failovers_totally_else 100.0\n"
)
ENGINES = json.dumps(
    {"engines": [{"name": "llm/p1", "state": "ready"}, {"name": "llm/p2", "state": "pending"}]}
).encode()


def _answer(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


def _chunked(*chunks: bytes, complete: bool = True) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
    return head + b"\r\n\r\n" + body + (b"0\r\n\r\n" if complete else b"")


ANSWERS = {
    "answers": _answer("200 OK", b'{"choices": []}'),
    "refuses": _answer("503 Service Unavailable", b'{"error": {}}'),
    "breaks-off": _chunked(b'{"choi', complete=False),
    "streams-to-the-end": _chunked(b"data: {}\n\n", b"data: [DONE]\n\n"),
    "streams-without-done": _chunked(b"data: {}\n\n"),
}
"""Chat answers by requested model; `breaks-off` closes the connection mid-body."""


async def router_stand_in(conn: EngineConnection) -> None:
    while (request := await conn.read_request()) is not None:
        head, body = request
        path = head.split(b" ", 2)[1]
        if path == b"/metrics":
            await conn.send(_answer("200 OK", METRICS, "text/plain"))
        elif path == b"/engines":
            await conn.send(_answer("200 OK", ENGINES))
        else:
            model = json.loads(body)["model"]
            await conn.send(ANSWERS[model])
            if model == "breaks-off":
                return


async def test_metric_value_sums_one_metric_over_its_labels_and_nothing_else() -> None:
    async with raw_engine(router_stand_in) as router:
        client = RouterClient(router.url)
        assert await client.metric_value("headcount_upstream_failovers_total") == 5.0


async def test_engines_by_name_keys_each_engine_by_its_object_name() -> None:
    async with raw_engine(router_stand_in) as router:
        engines = await RouterClient(router.url).engines_by_name()
    assert {name: engine["state"] for name, engine in engines.items()} == {
        "p1": "ready",
        "p2": "pending",
    }


@pytest.mark.parametrize(
    ("model", "stream", "ok", "failed", "cut"),
    [
        ("answers", False, 1, 0, 0),
        ("refuses", False, 0, 1, 0),
        ("breaks-off", False, 0, 0, 1),
        ("streams-to-the-end", True, 1, 0, 0),
        ("streams-without-done", True, 0, 1, 0),
    ],
)
async def test_traffic_counts_each_request_once_as_ok_failed_or_cut(
    model: str, stream: bool, ok: int, failed: int, cut: int
) -> None:
    async with raw_engine(router_stand_in) as router:
        async with steady_traffic(
            router.url, model, stream_every=1 if stream else 0, max_requests=1
        ) as traffic:
            await wait_until(lambda: traffic.sent == 1, what="the request sent")
    assert (traffic.ok, traffic.failed, traffic.cut) == (ok, failed, cut), traffic.failures
