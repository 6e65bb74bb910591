"""The endpoint picker's pure parts: the protocol's messages read and built, an engine's hold.

The stream itself, driven as Envoy drives it, is tests/process/test_gateway_picker.py.
"""

from __future__ import annotations

import json

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from headcount.config import OutlierSettings
from headcount.fleet import Fleet, ProbeResult
from headcount.gateway import protocol
from headcount.gateway.hold import Hold
from headcount.proxy.admission import Admitted
from headcount.routing import RequestFeatures
from headcount.surfaces.metrics import Metrics
from tests.support import engine

__all__: list[str] = []


def header_map(*pairs: tuple[str, str], raw: bool = True) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=k, raw_value=v.encode())
            if raw
            else base_pb2.HeaderValue(key=k, value=v)
            for k, v in pairs
        ]
    )


@pytest.mark.parametrize("raw", [True, False], ids=["raw_value", "value"])
def test_the_request_head_is_read_from_pseudo_headers_and_headers(raw: bool) -> None:
    method, path, headers = protocol.headers_of(
        header_map(
            (":method", "POST"),
            (":path", "/v1/chat/completions?x=1"),
            (":authority", "gw"),
            ("Authorization", "Bearer k"),
            raw=raw,
        )
    )
    assert (method, path) == (b"POST", b"/v1/chat/completions?x=1")
    assert headers == [(b"authorization", b"Bearer k")]


def test_status_and_a_header_are_read_from_the_response_head() -> None:
    head = header_map((":status", "503"), ("Content-Type", "text/event-stream"))
    assert protocol.status_of(head) == 503
    assert protocol.header_value(head, "content-type") == b"text/event-stream"
    assert protocol.header_value(head, "x-nothing") is None
    assert protocol.status_of(header_map((":status", "abc"))) == 0


def subset_metadata(value: object) -> base_pb2.Metadata:
    metadata = base_pb2.Metadata()
    fields = metadata.filter_metadata["envoy.lb.subset_hint"].fields
    if isinstance(value, str):
        fields["x-gateway-destination-endpoint-subset"].string_value = value
    else:
        assert isinstance(value, list)
        listed = fields["x-gateway-destination-endpoint-subset"].list_value
        for item in value:
            listed.values.add().string_value = item
    return metadata


def test_the_subset_hint_is_a_list_or_a_comma_separated_string() -> None:
    expected = frozenset({"10.0.0.1:8000", "10.0.0.2:8000"})
    assert protocol.subset_hint(subset_metadata(["10.0.0.1:8000", "10.0.0.2:8000"])) == expected
    assert protocol.subset_hint(subset_metadata("10.0.0.1:8000, 10.0.0.2:8000")) == expected
    assert protocol.subset_hint(subset_metadata([])) == frozenset()
    assert protocol.subset_hint(base_pb2.Metadata()) is None


def test_the_served_endpoint_is_read_from_envoy_lb() -> None:
    metadata = base_pb2.Metadata()
    assert protocol.served_endpoint(metadata) is None
    fields = metadata.filter_metadata["envoy.lb"].fields
    fields["x-gateway-destination-endpoint-served"].string_value = "10.0.0.2:8000"
    assert protocol.served_endpoint(metadata) == "10.0.0.2:8000"


def test_the_body_mode_is_the_one_the_gateway_announces_else_buffered() -> None:
    mode = processing_mode_pb2.ProcessingMode
    announced = ext_proc.ProcessingRequest(
        protocol_config=ext_proc.ProtocolConfiguration(request_body_mode=mode.FULL_DUPLEX_STREAMED)
    )
    assert protocol.request_body_mode(announced) == mode.FULL_DUPLEX_STREAMED
    assert protocol.request_body_mode(ext_proc.ProcessingRequest()) == mode.BUFFERED


def test_the_response_body_mode_is_read_apart_from_the_request_bodys() -> None:
    mode = processing_mode_pb2.ProcessingMode
    buffered_then_streamed = ext_proc.ProcessingRequest(
        protocol_config=ext_proc.ProtocolConfiguration(
            request_body_mode=mode.BUFFERED, response_body_mode=mode.FULL_DUPLEX_STREAMED
        )
    )
    assert protocol.response_streamed(buffered_then_streamed)
    streamed_then_not = ext_proc.ProcessingRequest(
        protocol_config=ext_proc.ProtocolConfiguration(
            request_body_mode=mode.FULL_DUPLEX_STREAMED, response_body_mode=mode.STREAMED
        )
    )
    assert not protocol.response_streamed(streamed_then_not)
    assert not protocol.response_streamed(ext_proc.ProcessingRequest())


def set_headers(common: ext_proc.CommonResponse) -> dict[str, bytes]:
    return {o.header.key: o.header.raw_value for o in common.header_mutation.set_headers}


def test_the_pick_is_named_alike_in_the_header_and_the_metadata() -> None:
    answer = protocol.picked_headers(["10.0.0.1:8000", "10.0.0.2:8000"], b"rid", None)
    headers = set_headers(answer.request_headers.response)
    value = "10.0.0.1:8000,10.0.0.2:8000"
    assert headers == {"x-gateway-destination-endpoint": value.encode(), "x-request-id": b"rid"}
    lb = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == value
    assert answer.request_headers.response.clear_route_cache


def test_a_buffered_pick_carries_a_rewritten_body_with_its_length() -> None:
    answer = protocol.buffered_body_response(["10.0.0.1:8000"], None, b'{"a": 1}')
    common = answer.request_body.response
    assert common.body_mutation.body == b'{"a": 1}'
    assert set_headers(common)["content-length"] == b"8"
    unchanged = protocol.buffered_body_response(["10.0.0.1:8000"], None, None)
    assert not unchanged.request_body.response.HasField("body_mutation")


def test_a_streamed_body_is_echoed_in_bounded_pieces_ending_once() -> None:
    body = bytes(range(256)) * 1000  # 256000 bytes: four pieces
    answers = protocol.body_responses(body, request=True)
    pieces = [a.request_body.response.body_mutation.streamed_response for a in answers]
    assert b"".join(p.body for p in pieces) == body
    assert [p.end_of_stream for p in pieces] == [False, False, False, True]
    [empty] = protocol.body_responses(b"", request=False, end=True)
    assert empty.response_body.response.body_mutation.streamed_response.end_of_stream


def test_a_refusal_is_an_immediate_response_with_the_data_planes_answer() -> None:
    body = json.dumps({"error": {"code": "rate_limited"}}).encode()
    block = b"content-type: application/json\r\nretry-after: 3\r\nx-request-id: r\r\n"
    answer = protocol.immediate(429, block, body, "headcount_429")
    response = answer.immediate_response
    assert response.status.code == 429
    assert {o.header.key: o.header.raw_value for o in response.headers.set_headers} == {
        "content-type": b"application/json",
        "retry-after": b"3",
        "x-request-id": b"r",
    }
    assert response.body == body


def test_the_response_body_is_skipped_only_when_not_needed() -> None:
    skipped = protocol.response_headers(b"", skip_body=True)
    assert skipped.mode_override.response_body_mode == processing_mode_pb2.ProcessingMode.NONE
    read = protocol.response_headers(b"x-ratelimit-remaining-requests: 4\r\n", skip_body=False)
    assert not read.HasField("mode_override")
    assert set_headers(read.response_headers.response) == {"x-ratelimit-remaining-requests": b"4"}


def fleet_of_names(*names: str, outliers: OutlierSettings | None = None) -> Fleet:
    fleet = Fleet(unhealthy_after=1, outliers=outliers)
    engines = [engine(n, "m", url=f"http://10.0.0.{i}:8000") for i, n in enumerate(names, 1)]
    fleet.reconcile("t", [each.spec for each in engines])
    for each in engines:
        fleet.apply_probe(each.id, ProbeResult(ok=True, cards=each.cards))
    return fleet


def first(fleet: Fleet) -> Admitted:
    return Admitted(fleet.snapshot.candidates("m")[0], RequestFeatures("m"))


def loads(fleet: Fleet) -> dict[str, tuple[int, int]]:
    return {e.spec.name: (e.load.in_flight, e.load.awaiting) for e in fleet.snapshot.engines}


def metrics_of(fleet: Fleet) -> Metrics:
    return Metrics(lambda: fleet.snapshot, [])


def test_a_hold_counts_from_the_pick_and_gives_back_once_at_the_end() -> None:
    fleet = fleet_of_names("a", "b")
    hold = Hold(first(fleet))
    assert loads(fleet) == {"a": (1, 1), "b": (0, 0)}
    hold.answered(fleet, "10.0.0.1:8000", 200)
    assert loads(fleet) == {"a": (1, 0), "b": (0, 0)}
    hold.release(fleet, metrics_of(fleet), 200, judged=True)
    assert loads(fleet) == {"a": (0, 0), "b": (0, 0)}


def test_a_hold_moves_to_the_fallback_that_served() -> None:
    fleet = fleet_of_names("a", "b")
    hold = Hold(first(fleet))
    served = hold.answered(fleet, "10.0.0.2:8000", 200)
    assert served.spec.name == "b"
    assert loads(fleet) == {"a": (0, 0), "b": (1, 0)}
    hold.release(fleet, metrics_of(fleet), 200, judged=True)
    assert loads(fleet) == {"a": (0, 0), "b": (0, 0)}


def test_a_5xx_counts_against_the_engine_and_a_whole_success_resets_it() -> None:
    fleet = fleet_of_names("a", outliers=OutlierSettings(consecutive_errors=5))
    counts = []
    for status, judged in ((503, True), (500, True), (200, True), (503, True), (200, False)):
        hold = Hold(first(fleet))
        hold.answered(fleet, None, status)
        hold.release(fleet, metrics_of(fleet), status, judged=judged)
        counts.append(fleet.snapshot.engines[0].load.consecutive_errors)
    assert counts == [1, 2, 0, 1, 1]


def test_every_header_the_picker_sets_replaces_the_clients() -> None:
    answers = [
        protocol.picked_headers(["10.0.0.1:8000"], b"rid", 3).request_headers.response,
        protocol.buffered_body_response(["10.0.0.1:8000"], b"rid", b"abc").request_body.response,
        protocol.response_headers(
            b"x-ratelimit-limit-requests: 1\r\n", False
        ).response_headers.response,
    ]
    options = [o for common in answers for o in common.header_mutation.set_headers]
    options += protocol.immediate(
        503, b"a: b\r\n", b"{}", "x"
    ).immediate_response.headers.set_headers
    overwrite = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert options and all(o.append_action == overwrite for o in options)
