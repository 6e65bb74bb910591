"""The endpoint-picker protocol's messages, read and built by pure functions.

What a gateway sends (`ProcessingRequest`): the request's headers (`:method`,
`:path` and the rest), its body, the response's headers with the endpoint that
served it (metadata `envoy.lb` → `x-gateway-destination-endpoint-served`), and
the subset hint (metadata `envoy.lb.subset_hint` →
`x-gateway-destination-endpoint-subset`, a list of `ip:port`). What the picker
answers (`ProcessingResponse`): the endpoints picked, in the
`x-gateway-destination-endpoint` header and the same value in dynamic metadata
`envoy.lb`; the body passed on (echoed as streamed body mutations in
`FULL_DUPLEX_STREAMED` mode, replaced only when admission rewrote it); or an
`ImmediateResponse` carrying the refusal the router's own data plane would send.
GIE's `docs/proposals/004-endpoint-picker-protocol` is the contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

__all__ = [
    "DESTINATION",
    "FULL_DUPLEX_STREAMED",
    "LB_NAMESPACE",
    "SERVED",
    "SKIP_RESPONSE_BODY",
    "SUBSET",
    "SUBSET_NAMESPACE",
    "body_responses",
    "buffered_body_response",
    "continue_body",
    "continue_headers",
    "continue_trailers",
    "header_value",
    "headers_of",
    "immediate",
    "picked_headers",
    "replaced_body",
    "request_body_mode",
    "response_headers",
    "response_streamed",
    "served_endpoint",
    "status_of",
    "subset_hint",
]

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
FULL_DUPLEX_STREAMED = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
_BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
_CHUNK = 64 * 1024
"""Bytes per streamed body mutation: well under gRPC's 4 MiB message limit."""

SKIP_RESPONSE_BODY = processing_mode_pb2.ProcessingMode(
    response_header_mode=processing_mode_pb2.ProcessingMode.SEND,
    response_body_mode=processing_mode_pb2.ProcessingMode.NONE,
    response_trailer_mode=processing_mode_pb2.ProcessingMode.SKIP,
)
"""Asked of the gateway when the picker needs nothing of the response body: Envoy honours it
with `allow_mode_override: true` and neither body mode FULL_DUPLEX_STREAMED (it ignores it
otherwise, and the picker then echoes the body)."""

_CONTINUE_HEADERS = ext_proc.HeadersResponse(response=ext_proc.CommonResponse())


def request_body_mode(message: Any) -> int:
    """The request body mode the gateway announces (`protocol_config`, Envoy ≥1.34 on its first
    message); BUFFERED when it says none, the one that works with an older Envoy either way."""
    mode: int = message.protocol_config.request_body_mode
    return mode if mode in (FULL_DUPLEX_STREAMED, _BUFFERED) else _BUFFERED


def response_streamed(message: Any) -> bool:
    """Whether the gateway streams the response body FULL_DUPLEX_STREAMED (then every piece
    is answered with its own streamed mutation), as its first message announces; the response
    may be in another mode than the request (a BUFFERED request, a streamed response)."""
    mode: int = message.protocol_config.response_body_mode
    streamed: bool = mode == FULL_DUPLEX_STREAMED
    return streamed


def _value(header: Any) -> bytes:
    raw: bytes = header.raw_value
    return raw if raw else header.value.encode("latin-1")


def headers_of(header_map: Any) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]]:
    """`:method`, `:path` and the other headers (names lowercased, pseudo-headers dropped)."""
    method, path = b"", b""
    headers: list[tuple[bytes, bytes]] = []
    for header in header_map.headers:
        name: str = header.key
        if name == ":method":
            method = _value(header)
        elif name == ":path":
            path = _value(header)
        elif not name.startswith(":"):
            headers.append((name.lower().encode("latin-1"), _value(header)))
    return method, path, headers


def header_value(header_map: Any, name: str) -> bytes | None:
    """The value of header `name` (lower case), None when absent."""
    for header in header_map.headers:
        if header.key.lower() == name:
            return _value(header)
    return None


def status_of(header_map: Any) -> int:
    """The response's `:status` (0 when absent or not a number)."""
    for header in header_map.headers:
        if header.key == ":status":
            value = _value(header)
            return int(value) if value.isdigit() else 0
    return 0


def _field(metadata: Any, namespace: str, key: str) -> Any:
    filter_metadata = metadata.filter_metadata
    if namespace not in filter_metadata:
        return None
    return filter_metadata[namespace].fields.get(key)


def subset_hint(metadata: Any) -> frozenset[str] | None:
    """The endpoints the gateway allows (`ip:port` each), None when it sets no hint; a list of
    strings or one comma-separated string, as the reference picker reads it."""
    value = _field(metadata, SUBSET_NAMESPACE, SUBSET)
    if value is None:
        return None
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        items: Iterable[str] = [value.string_value]
    elif kind == "list_value":
        items = [item.string_value for item in value.list_value.values]
    else:
        items = []
    return frozenset(
        endpoint.strip() for item in items for endpoint in item.split(",") if endpoint.strip()
    )


def served_endpoint(metadata: Any) -> str | None:
    """The endpoint that served the response, as the gateway reports it (None: not reported)."""
    value = _field(metadata, LB_NAMESPACE, SERVED)
    if value is None or value.WhichOneof("kind") != "string_value":
        return None
    served: str = value.string_value.strip()
    return served or None


_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def _set(name: str, value: bytes) -> Any:
    """`name: value` in place of any value the client sent (a client's own
    `x-gateway-destination-endpoint` must never steer the gateway)."""
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value), append_action=_OVERWRITE
    )


def _header_block(block: bytes) -> list[Any]:
    """Header lines (`name: value\\r\\n` each) as header mutations."""
    options = []
    for line in block.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if sep:
            options.append(_set(name.strip().lower().decode("latin-1"), value.strip()))
    return options


def _name(answer: Any, endpoints: Sequence[str]) -> bytes:
    """Name `endpoints` in `answer`'s dynamic metadata; the same value for the header."""
    value = ",".join(endpoints)
    namespace = answer.dynamic_metadata.fields[LB_NAMESPACE].struct_value
    namespace.fields[DESTINATION].string_value = value
    return value.encode("latin-1")


def picked_headers(
    endpoints: Sequence[str], request_id: bytes | None, body_length: int | None
) -> Any:
    """The request-headers answer naming `endpoints` (primary first) in the header and the
    dynamic metadata; `request_id` is set when the request came without one, `content-length`
    when the body was replaced (`body_length`)."""
    answer = ext_proc.ProcessingResponse()
    mutation = _mutation(_name(answer, endpoints), request_id, body_length)
    answer.request_headers.response.header_mutation.CopyFrom(mutation)
    answer.request_headers.response.clear_route_cache = True
    return answer


def _mutation(value: bytes, request_id: bytes | None, body_length: int | None) -> Any:
    options = [_set(DESTINATION, value)]
    if request_id is not None:
        options.append(_set("x-request-id", request_id))
    if body_length is not None:
        options.append(_set("content-length", b"%d" % body_length))
    return ext_proc.HeaderMutation(set_headers=options)


def buffered_body_response(
    endpoints: Sequence[str], request_id: bytes | None, body: bytes | None
) -> Any:
    """BUFFERED mode's answer to the whole body: the endpoints as `picked_headers` names them
    (the headers are still held), and the body replaced when admission rewrote it."""
    answer = ext_proc.ProcessingResponse()
    mutation = _mutation(_name(answer, endpoints), request_id, None if body is None else len(body))
    common = answer.request_body.response
    common.header_mutation.CopyFrom(mutation)
    common.clear_route_cache = True
    if body is not None:
        common.body_mutation.body = body
    return answer


def body_responses(body: bytes, *, request: bool, end: bool = True) -> list[Any]:
    """FULL_DUPLEX_STREAMED mode's echo of a body (or its rewrite) as streamed mutations,
    `end` on the last."""
    chunks = [body[start : start + _CHUNK] for start in range(0, len(body), _CHUNK)] or [b""]
    last = len(chunks) - 1
    responses = []
    for index, chunk in enumerate(chunks):
        mutation = ext_proc.BodyMutation(
            streamed_response=ext_proc.StreamedBodyResponse(
                body=chunk, end_of_stream=end and index == last
            )
        )
        answer = ext_proc.BodyResponse(response=ext_proc.CommonResponse(body_mutation=mutation))
        responses.append(
            ext_proc.ProcessingResponse(request_body=answer)
            if request
            else ext_proc.ProcessingResponse(response_body=answer)
        )
    return responses


def continue_headers(*, request: bool) -> Any:
    """Headers passed on unchanged."""
    if request:
        return ext_proc.ProcessingResponse(request_headers=_CONTINUE_HEADERS)
    return ext_proc.ProcessingResponse(response_headers=_CONTINUE_HEADERS)


def response_headers(header_block: bytes, skip_body: bool) -> Any:
    """The response-headers answer: `header_block` added (flow control's `x-ratelimit-*`), and
    the response body skipped when the picker needs none of it."""
    common = ext_proc.CommonResponse()
    if header_block:
        common.header_mutation.set_headers.extend(_header_block(header_block))
    answer = ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse(response=common))
    if skip_body:
        answer.mode_override.CopyFrom(SKIP_RESPONSE_BODY)
    return answer


def continue_body(*, request: bool) -> Any:
    """A body piece passed on unchanged (BUFFERED and STREAMED modes)."""
    answer = ext_proc.BodyResponse(response=ext_proc.CommonResponse())
    if request:
        return ext_proc.ProcessingResponse(request_body=answer)
    return ext_proc.ProcessingResponse(response_body=answer)


def replaced_body(body: bytes) -> Any:
    """A response body piece replaced by `body` (STREAMED mode: each piece on its own)."""
    mutation = ext_proc.BodyMutation(body=body)
    answer = ext_proc.BodyResponse(response=ext_proc.CommonResponse(body_mutation=mutation))
    return ext_proc.ProcessingResponse(response_body=answer)


def continue_trailers(*, request: bool) -> Any:
    answer = ext_proc.TrailersResponse()
    if request:
        return ext_proc.ProcessingResponse(request_trailers=answer)
    return ext_proc.ProcessingResponse(response_trailers=answer)


def immediate(status: int, header_block: bytes, body: bytes, details: str) -> Any:
    """The answer the gateway sends its client instead of forwarding: `status`, the header
    lines the router's own data plane would send, its OpenAI-shaped `body`."""
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status={"code": status},
            headers=ext_proc.HeaderMutation(set_headers=_header_block(header_block)),
            body=body,
            details=details,
        )
    )
