"""A gateway's side of the endpoint-picker protocol: ext_proc streams driven as Envoy drives them.

`PickerCall` opens one stream (one HTTP request) on the picker's port and sends
what Envoy's ext_proc filter sends: the request's headers (with the filter's
`protocol_config` and, if any, the subset hint), its body in chunks, the
response's headers with the endpoint that served them, the response's body.
`serve_picker` runs `headcount serve` with the picker as a child process and
finds the picker's port in its log.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from google.protobuf import struct_pb2

from headcount.sim.cluster import PYTHON_CLI
from headcount.sim.cluster.polling import wait_until
from headcount.sim.cluster.process import stop_child

__all__ = [
    "BUFFERED",
    "FULL_DUPLEX",
    "PickerCall",
    "PickerProcess",
    "chat_body",
    "destination",
    "serve_picker",
]

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
CALL_TIMEOUT = 10.0
_PICKER_LINE = re.compile(r"endpoint picker \(ext_proc, (?:h2c|tls)\) on [^ ]+:(\d+)")


def chat_body(model: str, content: str = "hi", **more: Any) -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **more}
    return json.dumps(body).encode()


def _header_map(pairs: Sequence[tuple[str, str]]) -> Any:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]
    )


def destination(answer: Any) -> tuple[str, str]:
    """The endpoints an answer names: in its header and in its dynamic metadata."""
    common = (
        answer.request_headers.response
        if answer.HasField("request_headers")
        else answer.request_body.response
    )
    header = next(
        option.header.raw_value.decode()
        for option in common.header_mutation.set_headers
        if option.header.key == "x-gateway-destination-endpoint"
    )
    fields = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    return header, fields["x-gateway-destination-endpoint"].string_value


class PickerCall:
    """One ext_proc stream, as Envoy's filter drives it for one HTTP request."""

    def __init__(self, stub: Any, mode: int) -> None:
        self.call = stub.Process(timeout=CALL_TIMEOUT)
        self.mode = mode

    async def send_headers(
        self,
        path: str = "/v1/chat/completions",
        *,
        method: str = "POST",
        headers: Sequence[tuple[str, str]] = (),
        subset: Sequence[str] | None = None,
        end: bool = False,
    ) -> None:
        message = ext_proc.ProcessingRequest(
            request_headers=ext_proc.HttpHeaders(
                headers=_header_map(
                    [(":method", method), (":path", path), (":authority", "gw"), *headers]
                ),
                end_of_stream=end,
            ),
            protocol_config=ext_proc.ProtocolConfiguration(
                request_body_mode=self.mode, response_body_mode=self.mode
            ),
        )
        if subset is not None:
            hint = message.metadata_context.filter_metadata["envoy.lb.subset_hint"]
            hint.fields["x-gateway-destination-endpoint-subset"].list_value.values.extend(
                [_string(endpoint) for endpoint in subset]
            )
        await self.call.write(message)

    async def send_body(self, body: bytes, chunk: int = 16) -> None:
        """The body in chunks of `chunk` bytes (FULL_DUPLEX_STREAMED), or whole (BUFFERED)."""
        pieces = (
            [body]
            if self.mode == BUFFERED
            else [body[i : i + chunk] for i in range(0, len(body), chunk)]
        )
        for index, piece in enumerate(pieces):
            await self.call.write(
                ext_proc.ProcessingRequest(
                    request_body=ext_proc.HttpBody(
                        body=piece, end_of_stream=index == len(pieces) - 1
                    )
                )
            )

    async def request(self, body: bytes, chunk: int = 16, **headers: Any) -> list[Any]:
        """Headers and body (in `chunk`-byte pieces) sent; the answers until the pick (or
        the refusal)."""
        await self.send_headers(**headers)
        answers = []
        if self.mode == BUFFERED:
            first = await self.read()
            answers.append(first)
            if first.HasField("immediate_response"):
                return answers
        await self.send_body(body, chunk)
        while True:
            answer = await self.read()
            answers.append(answer)
            if answer.HasField("immediate_response") or answer.HasField("request_body"):
                if self.mode == BUFFERED or answer.HasField("immediate_response"):
                    return answers
                if answer.request_body.response.body_mutation.streamed_response.end_of_stream:
                    return answers

    async def respond(
        self, status: int, served: str | None = None, *, content_type: str = "application/json"
    ) -> Any:
        message = ext_proc.ProcessingRequest(
            response_headers=ext_proc.HttpHeaders(
                headers=_header_map([(":status", str(status)), ("content-type", content_type)])
            )
        )
        if served is not None:
            lb = message.metadata_context.filter_metadata["envoy.lb"]
            lb.fields["x-gateway-destination-endpoint-served"].string_value = served
        await self.call.write(message)
        return await self.read()

    async def response_body(self, body: bytes, end: bool = True) -> Any:
        await self.call.write(
            ext_proc.ProcessingRequest(
                response_body=ext_proc.HttpBody(body=body, end_of_stream=end)
            )
        )
        return await self.read()

    async def read(self) -> Any:
        answer = await asyncio.wait_for(self.call.read(), CALL_TIMEOUT)
        assert answer is not grpc.aio.EOF, "the picker ended the stream"
        return answer

    async def close(self) -> None:
        """The stream's end, as Envoy's at the end of the HTTP request."""
        await self.call.done_writing()
        assert await asyncio.wait_for(self.call.read(), CALL_TIMEOUT) is grpc.aio.EOF


def _string(text: str) -> Any:
    return struct_pb2.Value(string_value=text)


@dataclass
class PickerProcess:
    """`headcount serve` with the picker: its picker port, admin URL, and the stub maker."""

    process: asyncio.subprocess.Process
    port: int
    log: Path
    channel: grpc.aio.Channel

    def call(self, mode: int = FULL_DUPLEX) -> PickerCall:
        return PickerCall(external_processor_pb2_grpc.ExternalProcessorStub(self.channel), mode)


@asynccontextmanager
async def serve_picker(
    argv: Sequence[str],
    log: Path,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str | None = None,
) -> AsyncIterator[PickerProcess]:
    """`headcount serve ARGV` (`--ext-proc-port 0` among them) until the block ends."""
    with log.open("wb") as out:
        child = await asyncio.create_subprocess_exec(
            *PYTHON_CLI, "serve", *argv, stdout=out, stderr=out
        )
        try:
            port: list[int] = []

            def listening() -> bool:
                text = log.read_text(errors="replace")
                if child.returncode is not None:
                    raise RuntimeError(f"router exited {child.returncode}: {text}")
                found = _PICKER_LINE.search(text)
                if found:
                    port.append(int(found.group(1)))
                return bool(found)

            await wait_until(listening, timeout=15, what="the picker listening")
            target = f"127.0.0.1:{port[0]}"
            if credentials is None:
                channel = grpc.aio.insecure_channel(target)
            else:
                options = (
                    [] if server_name is None else [("grpc.ssl_target_name_override", server_name)]
                )
                channel = grpc.aio.secure_channel(target, credentials, options=options)
            async with channel:
                yield PickerProcess(child, port[0], log, channel)
        finally:
            await stop_child(child)
