"""One request through a gateway: its ext_proc stream, from its headers to its single end.

The gateway (Envoy's ext_proc filter) opens one stream per HTTP request. The
picker reads the request's headers and body, builds the router's own `Request`
from them and takes the data plane's one admission path (`Proxy.screen`'s key
check, then `Admission.admit`, awaiting a `Later`): the engine it admits is
named to the gateway with up to `fallbacks` more (the model's other candidates
in least-loaded order: asking the policy again would move round-robin's
cursor); a refusal becomes an `ImmediateResponse` with the status, headers and
body the data plane sends. Body modes: `FULL_DUPLEX_STREAMED` (the headers
answer waits for the whole body, which is then echoed, or replaced, as
streamed mutations) and `BUFFERED` (headers passed on at once, the pick in the
answer to the whole body); the gateway's `protocol_config` says which.

The picked engine holds `engine.load.in_flight` (and `awaiting`, kv-aware's
prefill hold) from the pick; the response's headers say which endpoint served
(`x-gateway-destination-endpoint-served`: the hold moves when the gateway
retried a fallback) and its status. The request ends once (`_Stream.finish`),
whatever ends its stream: the response's last body piece, the stream's end
(its body skipped: `mode_override`), or its cancellation (the client left, the
gateway reset it). Then the hold is released, the answer feeds outlier
detection as `proxy/exchange.py` says (502/503 and gateway errors count against
the engine, an answer under 500 resets its count), flow control's ticket is
settled with the usage the answer reported, and the metrics and access log
hear of it as of a request of the data plane.

The response body is read only when flow control or a Responses create
(`stored_responses.IdTap`: which engine stores the response) needs it; else
the picker asks the gateway to skip it (`mode_override`, which Envoy honours
with `allow_mode_override: true` and no FULL_DUPLEX_STREAMED body mode;
otherwise the body still comes and is echoed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import grpc

from headcount._http.answers import too_large_message
from headcount._http.handler import Request
from headcount._http.wire import error_body
from headcount.fleet import Engine
from headcount.gateway import protocol
from headcount.gateway.hold import Hold
from headcount.proxy import Proxy
from headcount.proxy.admission import Admitted, Later, Refused
from headcount.proxy.dataplane import key_refusal, method_refusal
from headcount.proxy.errors import INTERNAL_ERROR, ErrorAnswer
from headcount.proxy.exchange import CLIENT_CLOSED_STATUS
from headcount.proxy.headers import find_header
from headcount.proxy.paths import PROXIED, RESPONSES, passes_through
from headcount.proxy.rejections import refusal_entry, tenant_name
from headcount.proxy.stored_responses import IdTap, response_id_of
from headcount.proxy.usage import UsageTap
from headcount.routing import PinnedFeatures
from headcount.surfaces.access_log import AccessEntry
from headcount.surfaces.metrics import CLIENT_CLOSED, CUT, UNKNOWN_MODEL, whole

__all__ = ["Picker"]

_log = logging.getLogger("headcount.gateway")

_NOT_PICKED = ErrorAnswer(
    404,
    error_body(
        "the endpoint picker routes inference requests only", "invalid_request_error", "not_found"
    ),
)


class Picker:
    """Envoy's `ExternalProcessor` service: one coroutine per stream, no task per message."""

    def __init__(self, proxy: Proxy, fallbacks: int = 0) -> None:
        """Admits through `proxy`'s admission; names up to `fallbacks` more endpoints."""
        self._proxy = proxy
        self._fallbacks = fallbacks

    async def Process(self, requests: Any, context: Any) -> None:
        stream = _Stream(self._proxy, self._fallbacks)
        try:
            while True:
                message = await context.read()
                if message is grpc.aio.EOF:
                    return
                try:
                    answers = await stream.on(message)
                except Exception:
                    if not stream.may_refuse:
                        raise  # the stream ends with an error; `finish` gives the hold back
                    _log.exception("the endpoint picker failed on a request: answered 500")
                    answers = [stream.refuse(Refused(INTERNAL_ERROR, UNKNOWN_MODEL))]
                for answer in answers:
                    await context.write(answer)
                if stream.closed:
                    return
        except asyncio.CancelledError:
            stream.cancelled = True
            raise
        finally:
            stream.finish()


class _Null:
    """A responder that sends nothing: the taps read the answer, the gateway relays it."""

    def respond(self, status: int, header_block: bytes, body: bytes) -> None:
        pass

    def start(self, *args: Any) -> None:
        pass

    def write(self, body: bytes, complete: bool) -> None:
        pass

    def abort(self) -> None:
        pass

    def attach(self, listener: Any) -> None:
        pass


class _Stream:
    """One request's stream: what it asked, which engine holds it, how it ended."""

    def __init__(self, proxy: Proxy, fallbacks: int) -> None:
        self._proxy = proxy
        self._fallbacks = fallbacks
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._request: Request | None = None
        self._request_id = b""
        self._new_id: bytes | None = None
        self._streamed = False
        self._response_streamed = False
        self._parts: list[bytes] = []
        self._size = 0
        self._admitted: Admitted | None = None
        self._hold: Hold | None = None
        self._status = 0
        self._ttfb: float | None = None
        self._usage: UsageTap | None = None
        self._ids: IdTap | None = None
        self._needs_body = False
        self._body_done = False
        self._drawn = False
        self._ended = False
        self.closed = False
        """Whether the picker has said its last word (an `ImmediateResponse`)."""
        self.cancelled = False

    # -- the request --------------------------------------------------------------------------

    async def on(self, message: Any) -> Sequence[Any]:
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return await self._headers(message)
        if kind == "request_body":
            return await self._body(message.request_body.body, message.request_body.end_of_stream)
        if kind == "response_headers":
            return [self._response_headers(message)]
        if kind == "response_body":
            return self._response_body(message.response_body)
        if kind == "request_trailers":
            return [protocol.continue_trailers(request=True)]
        if kind == "response_trailers":
            return [protocol.continue_trailers(request=False)]
        return []

    async def _headers(self, message: Any) -> Sequence[Any]:
        method, target, headers = protocol.headers_of(message.request_headers.headers)
        request = Request(method, target, headers, b"", True, True)
        request.subset = protocol.subset_hint(message.metadata_context)
        self._request = request
        self._streamed = protocol.request_body_mode(message) == protocol.FULL_DUPLEX_STREAMED
        self._response_streamed = protocol.response_streamed(message)
        proxy = self._proxy
        request_id = find_header(headers, b"x-request-id")
        if request_id is None:
            request_id = self._new_id = proxy.new_request_id()
        self._request_id = request_id
        refused = self._screen(request)
        if refused is not None:
            return [self.refuse(refused)]
        stored = response_id_of(request.path, method)
        if stored is not None:
            return await self._decide(proxy.admission.stored(stored), headers_phase=True)
        if message.request_headers.end_of_stream:
            return await self._decide(proxy.admission.admit(request), headers_phase=True)
        if self._streamed:
            return []
        return [protocol.continue_headers(request=True)]

    def _screen(self, request: Request) -> Refused | None:
        """The data plane's head screen for a request to route: a key (with client keys), a
        path that goes to an engine, `POST`."""
        proxy = self._proxy
        keys = proxy.credentials.client_keys
        if keys is not None:
            tenant = keys.tenant(request.headers)
            if tenant is None:
                return key_refusal(request.headers)
            request.identity = tenant
        path, method = request.path, request.method
        if path in PROXIED or (proxy.passthrough and passes_through(path, method)):
            return None if method == b"POST" else method_refusal(request)
        if response_id_of(path, method):
            return None
        return Refused(_NOT_PICKED, UNKNOWN_MODEL)

    async def _body(self, piece: bytes, end: bool) -> Sequence[Any]:
        if self._admitted is not None:  # picked from the head (a stored response's cancel)
            if self._streamed:
                return protocol.body_responses(piece, request=True, end=end)
            return [protocol.continue_body(request=True)]
        if self._request is None:
            return [protocol.continue_body(request=True)]
        self._parts.append(piece)
        self._size += len(piece)
        limit = self._proxy.limits.max_body_size
        if self._size > limit:
            message = too_large_message(limit)
            answer = ErrorAnswer(
                413, error_body(message, "invalid_request_error", "request_too_large")
            )
            return [self.refuse(Refused(answer, UNKNOWN_MODEL))]
        if not end:
            return []
        request = self._request
        request.body = b"".join(self._parts)
        self._parts = []
        return await self._decide(self._proxy.admission.admit(request), headers_phase=False)

    async def _decide(
        self, decision: Admitted | Refused | Later, *, headers_phase: bool
    ) -> Sequence[Any]:
        if isinstance(decision, Later):
            decision = await decision.decision
        if isinstance(decision, Refused):
            return [self.refuse(decision)]
        self._admit(decision)
        endpoints = self._endpoints(decision)
        request = self._request
        body = decision.body
        if headers_phase:
            return [protocol.picked_headers(endpoints, self._new_id, None)]
        if not self._streamed:
            return [protocol.buffered_body_response(endpoints, self._new_id, body)]
        sent = body if body is not None else b"" if request is None else request.body
        length = None if body is None else len(body)
        return [
            protocol.picked_headers(endpoints, self._new_id, length),
            *protocol.body_responses(sent, request=True),
        ]

    def _endpoints(self, admitted: Admitted) -> list[str]:
        """The engine admitted, then up to `fallbacks` of the model's other candidates."""
        engine = admitted.engine
        endpoints = [engine.spec.endpoint()]
        if not self._fallbacks or isinstance(admitted.features, PinnedFeatures):
            return endpoints
        subset = None if self._request is None else self._request.subset
        others = [
            other
            for other in self._proxy.fleet.snapshot.candidates(admitted.features.model)
            if other is not engine and (subset is None or other.spec.endpoint() in subset)
        ]
        others.sort(key=_load)
        endpoints.extend(other.spec.endpoint() for other in others[: self._fallbacks])
        return endpoints

    def _admit(self, admitted: Admitted) -> None:
        self._admitted = admitted
        self._hold = Hold(admitted)
        request = self._request
        self._needs_body = admitted.ticket is not None or (
            request is not None and request.path == RESPONSES
        )

    def refuse(self, refused: Refused) -> Any:
        """The refusal as the gateway's immediate answer, counted and logged as the data
        plane counts and logs its own."""
        self.closed = True
        self._ended = True
        status, body = refused.answer
        proxy = self._proxy
        duration = self._loop.time() - self._started
        proxy.metrics.request_done(refused.label, status, whole(status), duration, None)
        access = proxy.access
        if access.wants(True):
            access.write(
                refusal_entry(
                    self._request,
                    self._request_id,
                    refused.model or refused.label,
                    status,
                    duration,
                    len(body),
                )
            )
        block = refused.headers + b"x-request-id: %s\r\n" % self._request_id
        return protocol.immediate(status, block, body, f"headcount_{status}")

    @property
    def may_refuse(self) -> bool:
        """Whether the request can still be refused: nothing picked, nothing answered."""
        return self._hold is None and not self._ended

    # -- the response -------------------------------------------------------------------------

    def _response_headers(self, message: Any) -> Any:
        admitted, hold = self._admitted, self._hold
        headers = message.response_headers.headers
        status = self._status = protocol.status_of(headers)
        if admitted is None or hold is None:
            return protocol.continue_headers(request=False)
        self._ttfb = self._loop.time() - self._started
        served = protocol.served_endpoint(message.metadata_context)
        engine = hold.answered(self._proxy.fleet, served, status)
        self._drawn = 200 <= status < 300 and self._proxy.access.draw()
        ticket = admitted.ticket
        if ticket is not None:
            content_type = protocol.header_value(headers, "content-type")
            # flow control asked the engine for usage the client did not: cut it out again
            self._usage = UsageTap.for_response(content_type, ticket.forward is not None)
        if self._request is not None and self._request.path == RESPONSES and status == 200:
            self._ids = IdTap(_Null(), self._learned)
        block = b"" if ticket is None else ticket.headers
        kv = admitted.features.kv
        if kv is not None:  # the route receipt, as the data plane sends it
            block += kv.receipt(engine)
        return protocol.response_headers(block, skip_body=not self._needs_body)

    def _response_body(self, body: Any) -> Sequence[Any]:
        piece, end = body.body, body.end_of_stream
        usage, ids = self._usage, self._ids
        if ids is not None:
            ids.write(piece, end)
        sent = piece
        if usage is not None:
            sent = usage.through(piece, end)
        if end:
            self._body_done = True
            self.finish()
        if self._response_streamed:
            return protocol.body_responses(sent, request=False, end=end)
        if sent != piece:
            return [protocol.replaced_body(sent)]
        return [protocol.continue_body(request=False)]

    def _learned(self, response_id: str) -> None:
        admitted, hold = self._admitted, self._hold
        if admitted is not None and hold is not None:
            self._proxy.stored.learn(response_id, hold.engine, admitted.features.model)

    # -- the end ------------------------------------------------------------------------------

    def finish(self) -> None:
        """The request's single end: the hold released, the outcome recorded."""
        if self._ended:
            return
        self._ended = True
        admitted, hold = self._admitted, self._hold
        if admitted is None or hold is None:
            return  # the stream ended before anything was decided: nothing to count
        status = self._status or CLIENT_CLOSED_STATUS
        if self.cancelled or not self._status:
            outcome = CLIENT_CLOSED
        elif self._needs_body and not self._body_done:
            outcome = CUT
        else:
            outcome = whole(status)
        proxy, engine = self._proxy, hold.engine
        hold.release(proxy.fleet, proxy.metrics, status, judged=outcome == whole(status))
        ticket = admitted.ticket
        if ticket is not None:
            ticket.settle(self._reported(), status)
        duration = self._loop.time() - self._started
        model = admitted.features.model
        proxy.metrics.request_done(model, status, outcome, duration, self._ttfb)
        if proxy.access.wants(self._drawn or not 200 <= status < 300 or outcome == CUT):
            proxy.access.write(self._entry(engine, status, outcome, duration))

    def _reported(self) -> tuple[int | None, int | None] | None:
        usage = self._usage
        return None if usage is None else usage.reported()

    def _entry(self, engine: Engine, status: int, outcome: str, duration: float) -> AccessEntry:
        request, admitted = self._request, self._admitted
        kv = None if admitted is None else admitted.features.kv
        return AccessEntry(
            request_id=self._request_id,
            method=b"" if request is None else request.method,
            path=b"" if request is None else request.path,
            model="" if admitted is None else admitted.features.model,
            engine=engine.spec.name,
            status=status,
            outcome=outcome,
            ttfb=self._ttfb,
            duration=duration,
            bytes_in=0 if request is None else len(request.body),
            bytes_out=0,
            failovers=0,
            cut=outcome == CUT,
            cached_tokens=None if kv is None else kv.predicted.get(engine.id, 0),
            tenant=None if request is None else tenant_name(request.identity),
            tokens=self._reported(),
        )


def _load(engine: Engine) -> float:
    load = engine.load
    return load.in_flight + load.running + load.waiting
