"""A request as flow control weighs it: tenant, priority, flow, reservation, the usage ask."""

from __future__ import annotations

import json

from headcount._http.handler import Request
from headcount.auth import Credentials
from headcount.auth.tenants import parse_tenants
from headcount.config import FlowSettings
from headcount.flow.control import FlowControl
from headcount.flow.ticket import DEFAULT_COMPLETION_RESERVE, Ticket
from headcount.flow.window import MemoryStore
from headcount.proxy.demand import ticket_of
from headcount.proxy.payload import parse_request
from tests.support.builders import ready_fleet, spec

__all__: list[str] = []

TENANTS = """
[default]
priority = 5

[objective.batch]
priority = -1

[objective.urgent]
priority = 50
"""


def _weigh(
    body: dict[str, object], path: bytes = b"/v1/chat/completions", **headers: str
) -> Ticket:
    credentials = Credentials(tenants=True)
    credentials.use_tenants(parse_tenants(TENANTS))
    fleet = ready_fleet(spec("a"))
    control = FlowControl(fleet, FlowSettings(), MemoryStore(), lambda: credentials.tenants)
    raw = json.dumps(body).encode()
    request = Request(
        b"POST",
        path,
        [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()],
        raw,
        True,
        True,
    )
    parsed = parse_request(raw)
    assert isinstance(parsed, dict)
    return ticket_of(control, credentials, request, parsed, "m")


def test_open_mode_requests_are_the_default_tenants_and_an_objective_only_lowers() -> None:
    plain = _weigh({"model": "m", "messages": []})
    assert (plain.tenant.name, plain.priority, plain.flow) == ("default", 5, "")
    batch = _weigh({"model": "m"}, x_gateway_inference_objective="batch")
    assert batch.priority == -1
    urgent = _weigh({"model": "m"}, x_gateway_inference_objective="urgent")
    assert urgent.priority == 5
    flow = _weigh({"model": "m"}, x_gateway_inference_fairness_id="u" * 500)
    assert flow.flow == "u" * 128


def test_the_reservation_counts_the_prompt_and_the_most_the_answer_may_take() -> None:
    body = {"model": "m", "prompt": "x" * 400, "max_tokens": 30, "max_completion_tokens": 20}
    assert _weigh(body, b"/v1/completions").tokens == _bytes_over_4(body) + 20
    counted = _weigh(body, b"/v1/completions")
    counted.prompt = 7  # counted by the router's tokenizer, before anything asks
    assert counted.tokens == 27 and counted.body is None, "worked out once, the body let go"
    for unbounded in ({"model": "m"}, {"model": "m", "max_tokens": True}):
        assert _weigh(unbounded).tokens == _bytes_over_4(unbounded) + DEFAULT_COMPLETION_RESERVE
    negative = {"model": "m", "max_completion_tokens": -1, "max_tokens": 9}
    assert _weigh(negative).tokens == _bytes_over_4(negative) + 9
    embedding = {"model": "m", "input": "x"}
    assert _weigh(embedding, b"/v1/embeddings").tokens == _bytes_over_4(embedding)


def _bytes_over_4(body: dict[str, object]) -> int:
    return len(json.dumps(body).encode()) // 4


def test_a_stream_that_does_not_ask_for_usage_is_forwarded_asking() -> None:
    asked = _weigh({"model": "m", "stream": True})
    assert asked.forward is not None
    assert json.loads(asked.forward)["stream_options"] == {"include_usage": True}
    already = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    assert _weigh(already).forward is None
    assert _weigh({"model": "m"}).forward is None
