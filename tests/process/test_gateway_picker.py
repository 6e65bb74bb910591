"""The endpoint picker as a gateway sees it: `headcount serve --ext-proc-port 0`, driven over
gRPC exactly as Envoy's ext_proc filter drives it, before simulated engines.

The router runs as a child process; what it decides is read from its ext_proc
answers, its gRPC health and its `/engines` (in-flight counts, outlier state).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headcount.sim.cluster import Timings, sim_cluster
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine
from headcount.sim.loopback import free_port
from tests.support import wait_until
from tests.support.ext_proc import (
    BUFFERED,
    FULL_DUPLEX,
    PickerProcess,
    chat_body,
    destination,
    serve_picker,
)

__all__: list[str] = []

pytestmark = pytest.mark.timeout(90)

HOST = "127.0.0.1"
MODEL = "sim-model"
FAST = ["--probe-interval=0.2", "--probe-timeout=2", "--drain-delay=0"]


@asynccontextmanager
async def engines(count: int) -> AsyncIterator[list[SimEngine]]:
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(running_engine(EngineSimConfig(host=HOST, model=MODEL)))
            for _ in range(count)
        ]


def endpoint(engine: SimEngine) -> str:
    return engine.url.removeprefix("http://")


@asynccontextmanager
async def picker(
    tmp_path: Path, backends: list[str], *more: str, ready: bool = True, **options: Any
) -> AsyncIterator[tuple[PickerProcess, str]]:
    """A router with the picker and an admin port before `backends`, once they are ready."""
    admin = free_port(HOST)
    argv = [
        f"--host={HOST}",
        "--port=off",
        f"--admin-port={admin}",
        "--ext-proc-port=0",
        "--discovery=static",
        f"--backends={','.join(backends)}",
        *FAST,
        *more,
    ]
    admin_url = f"http://{HOST}:{admin}"
    async with serve_picker(argv, tmp_path / "router.log", **options) as process:
        if ready:
            await wait_until(
                lambda: ready_engines(admin_url, len(backends)), what="engines ready", timeout=15
            )
        yield process, admin_url


async def engines_json(admin_url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.get(admin_url + "/engines") as response:
            return list((await response.json())["engines"])


async def ready_engines(admin_url: str, count: int) -> bool:
    try:
        states = [engine["state"] for engine in await engines_json(admin_url)]
    except aiohttp.ClientError:
        return False
    return states.count("ready") == count


async def in_flight(admin_url: str) -> dict[str, int]:
    return {
        engine["url"].removeprefix("http://"): engine["in_flight"]
        for engine in await engines_json(admin_url)
    }


def immediate(answer: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    assert answer.HasField("immediate_response"), answer
    response = answer.immediate_response
    headers = {
        option.header.key: option.header.raw_value.decode()
        for option in response.headers.set_headers
    }
    return response.status.code, headers, json.loads(response.body)


@pytest.mark.parametrize(
    "routing", ["round-robin", "least-loaded", "session", "prefix", "kv-aware"]
)
@pytest.mark.parametrize("mode", [FULL_DUPLEX, BUFFERED], ids=["full-duplex", "buffered"])
async def test_the_picked_endpoint_is_a_live_engine_for_every_policy(
    tmp_path: Path, routing: str, mode: int
) -> None:
    async with (
        engines(2) as sims,
        picker(tmp_path, [s.url for s in sims], f"--routing={routing}") as (process, _),
    ):
        live = {endpoint(s) for s in sims}
        body = chat_body(MODEL, "a prompt " * 20)
        for _ in range(4):
            call = process.call(mode)
            answers = await call.request(body)
            header, metadata = destination(answers[-1 if mode == BUFFERED else 0])
            assert header == metadata
            assert header in live
            if mode == FULL_DUPLEX:
                echoed = b"".join(
                    a.request_body.response.body_mutation.streamed_response.body
                    for a in answers[1:]
                )
                assert echoed == body  # the body passes on unchanged
            head = await call.respond(200, header)
            assert head.HasField("mode_override")  # nothing needs the response body
            echo = await call.response_body(b'{"choices": []}')
            if mode == FULL_DUPLEX:  # Envoy ignores the override then: the body is echoed
                streamed = echo.response_body.response.body_mutation.streamed_response
                assert (streamed.body, streamed.end_of_stream) == (b'{"choices": []}', True)
            await call.close()


async def test_unknown_model_is_a_404_immediate_response(tmp_path: Path) -> None:
    async with engines(1) as sims, picker(tmp_path, [sims[0].url]) as (process, _):
        answers = await process.call().request(chat_body("no-such-model"))
        status, headers, body = immediate(answers[-1])
        assert status == 404
        assert body["error"]["code"] == "model_not_found"
        assert headers["content-type"] == "application/json"
        assert "x-request-id" in headers


async def test_no_routable_engine_is_a_503_immediate_response(tmp_path: Path) -> None:
    dead = f"http://{HOST}:{free_port(HOST)}"
    async with picker(tmp_path, [dead], ready=False) as (process, admin_url):

        async def unhealthy() -> bool:
            return [e["state"] for e in await engines_json(admin_url)] == ["unhealthy"]

        await wait_until(unhealthy, what="the engine unhealthy")
        answers = await process.call().request(chat_body(MODEL))
        status, _, body = immediate(answers[-1])
        assert status == 503, body


async def test_a_request_without_a_valid_key_is_a_401(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-picker-key\n")
    async with (
        engines(1) as sims,
        picker(tmp_path, [sims[0].url], f"--api-keys-file={keys}") as (process, _),
    ):
        call = process.call()
        await call.send_headers(headers=[("authorization", "Bearer sk-wrong")])
        status, headers, body = immediate(await call.read())
        assert status == 401
        assert headers["www-authenticate"] == "Bearer"
        assert body["error"]["code"] == "invalid_api_key"
        answers = await process.call().request(
            chat_body(MODEL), headers=[("authorization", "Bearer sk-picker-key")]
        )
        assert destination(answers[0])[0] == endpoint(sims[0])


async def test_the_subset_hint_is_honoured_and_an_empty_one_is_a_503(tmp_path: Path) -> None:
    async with engines(3) as sims, picker(tmp_path, [s.url for s in sims]) as (process, _):
        allowed = endpoint(sims[1])
        for _ in range(4):
            answers = await process.call().request(chat_body(MODEL), subset=[allowed])
            assert destination(answers[0]) == (allowed, allowed)
        for subset in ([], [f"{HOST}:1"]):
            answers = await process.call().request(chat_body(MODEL), subset=subset)
            status, _, body = immediate(answers[-1])
            assert status == 503, body


async def test_in_flight_rises_at_the_pick_and_returns_at_the_end(tmp_path: Path) -> None:
    async with engines(1) as sims, picker(tmp_path, [sims[0].url]) as (process, admin_url):
        picked = endpoint(sims[0])
        call = process.call()
        await call.request(chat_body(MODEL))
        assert (await in_flight(admin_url))[picked] == 1
        await call.respond(200, picked)
        await call.response_body(b"{}")
        await call.close()
        assert (await in_flight(admin_url))[picked] == 0


async def test_in_flight_returns_when_the_stream_is_cancelled(tmp_path: Path) -> None:
    async with engines(1) as sims, picker(tmp_path, [sims[0].url]) as (process, admin_url):
        picked = endpoint(sims[0])
        call = process.call()
        await call.request(chat_body(MODEL))
        await call.respond(200, picked, content_type="text/event-stream")
        assert (await in_flight(admin_url))[picked] == 1
        call.call.cancel()

        async def released() -> bool:
            return (await in_flight(admin_url))[picked] == 0

        await wait_until(released, what="the engine's in-flight back to 0")


async def test_the_hold_moves_to_the_endpoint_that_served(tmp_path: Path) -> None:
    async with (
        engines(2) as sims,
        picker(tmp_path, [s.url for s in sims]) as (
            process,
            admin_url,
        ),
    ):
        call = process.call()
        answers = await call.request(chat_body(MODEL))
        primary = destination(answers[0])[0]
        other = next(endpoint(s) for s in sims if endpoint(s) != primary)
        assert await in_flight(admin_url) == {primary: 1, other: 0}
        await call.respond(200, other)  # the gateway retried on another endpoint
        assert await in_flight(admin_url) == {primary: 0, other: 1}
        await call.response_body(b"{}")
        await call.close()
        assert await in_flight(admin_url) == {primary: 0, other: 0}


async def test_a_503_answer_counts_against_the_engine(tmp_path: Path) -> None:
    async with (
        engines(2) as sims,
        picker(tmp_path, [s.url for s in sims], "--outlier-consecutive-errors=2") as (
            process,
            admin_url,
        ),
    ):
        bad = endpoint(sims[0])
        for _ in range(2):
            call = process.call()
            await call.request(chat_body(MODEL), subset=[bad])
            await call.respond(503, bad)
            await call.response_body(b"{}")
            await call.close()
        outlier = next(
            e["outlier"] for e in await engines_json(admin_url) if e["url"].endswith(bad)
        )
        assert outlier["ejected"], outlier


async def health_of(process: PickerProcess, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(process.channel)
    answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(answer.status)


async def test_grpc_readiness_follows_the_fleet(tmp_path: Path) -> None:
    dead = f"http://{HOST}:{free_port(HOST)}"
    async with picker(tmp_path, [dead], "--ready-requires-engines", ready=False) as (process, _):
        assert await health_of(process, "liveness") == health_pb2.HealthCheckResponse.SERVING
        for service in ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            status = await health_of(process, service)
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    async with (
        engines(1) as sims,
        picker(tmp_path, [sims[0].url], "--ready-requires-engines") as (process, _),
    ):

        async def serving() -> bool:
            status = await health_of(process, "envoy.service.ext_proc.v3.ExternalProcessor")
            return status == health_pb2.HealthCheckResponse.SERVING

        await wait_until(serving, what="the ext_proc service SERVING")
        assert await health_of(process, "readiness") == health_pb2.HealthCheckResponse.SERVING


async def test_tls_on_the_picker_port(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("picker.example")
    cert_file, key_file = tmp_path / "picker.crt", tmp_path / "picker.key"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
    async with (
        engines(1) as sims,
        picker(
            tmp_path,
            [sims[0].url],
            f"--ext-proc-tls-cert={cert_file}",
            f"--ext-proc-tls-key={key_file}",
            credentials=credentials,
            server_name="picker.example",
        ) as (process, _),
    ):
        answers = await process.call().request(chat_body(MODEL))
        assert destination(answers[0])[0] == endpoint(sims[0])


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--port=off", "--admin-port=9"], "--port off needs --ext-proc-port"),
        (["--port=off", "--ext-proc-port=0"], "--port off needs --admin-port"),
        (["--ext-proc-port=0", "--ext-proc-tls-cert=/nonexistent"], "go together"),
        (
            [
                "--ext-proc-port=0",
                "--ext-proc-tls-cert=/etc/hostname",
                "--ext-proc-tls-key=/etc/hostname",
            ],
            "--ext-proc-tls-cert /etc/hostname",
        ),
    ],
)
async def test_bad_picker_flags_are_one_line_and_exit_2(flags: list[str], says: str) -> None:
    from headcount.sim.cluster import PYTHON_CLI

    child = await asyncio.create_subprocess_exec(
        *PYTHON_CLI,
        "serve",
        "--discovery=static",
        f"--backends=http://{HOST}:1",
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(child.communicate(), 30)
    lines = output.decode().strip().splitlines()
    assert child.returncode == 2, output
    assert len(lines) == 1 and says in lines[0], lines


TIMINGS = Timings(
    probe_interval=0.5,
    watch_idle_timeout=1,
    api_request_timeout=1,
    api_connect_timeout=0.5,
    backoff_initial=0.1,
    backoff_max=0.5,
    discovery_stale_after=2.0,
    discovery_dead_after=3.0,
    drain_delay=0,
    drain_timeout=1,
)


async def test_the_picker_is_not_serving_before_the_first_sync_nor_when_discovery_is_stale(
    tmp_path: Path,
) -> None:
    ext_proc = "envoy.service.ext_proc.v3.ExternalProcessor"
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    cluster = sim_cluster(tmp_path, ["127.0.0.2"], bookmark_interval=0.3)
    async with cluster as one_pod:
        await one_pod.add_engine("engine-0", "127.0.0.2", model=MODEL)
        await one_pod.api.refuse()
        flags = replace(one_pod.router_flags(TIMINGS), ready_requires_fresh=True)
        argv = [f"--host={HOST}", f"--port={free_port(HOST)}", "--ext-proc-port=0", *flags.argv()]
        async with serve_picker(argv, tmp_path / "router.log") as process:

            async def status_is(wanted: int, service: str = ext_proc) -> bool:
                return await health_of(process, service) == wanted

            assert await status_is(not_serving)
            assert await status_is(not_serving, "readiness")
            assert await status_is(serving, "liveness")
            await one_pod.api.restore()
            await wait_until(lambda: status_is(serving), timeout=10, what="SERVING once synced")
            await one_pod.api.blackhole()
            await wait_until(lambda: status_is(not_serving), timeout=10, what="stale: NOT_SERVING")
            assert await status_is(serving, "liveness")


TENANTS = """
[[tenant]]
name = "capped"
keys = ["sk-capped"]
requests_per_minute = 1
tokens_per_minute = 100000
"""


async def test_flow_control_refuses_429_and_settles_the_usage_the_answer_reports(
    tmp_path: Path,
) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    key = [("authorization", "Bearer sk-capped")]
    async with (
        engines(1) as sims,
        picker(tmp_path, [sims[0].url], f"--tenants-file={tenants}") as (process, admin_url),
    ):
        picked = endpoint(sims[0])
        call = process.call()
        answers = await call.request(chat_body(MODEL), headers=key)
        assert destination(answers[0])[0] == picked
        head = await call.respond(200, picked)
        assert not head.HasField("mode_override")  # flow control reads the usage
        added = {
            o.header.key: o.header.raw_value.decode()
            for o in head.response_headers.response.header_mutation.set_headers
        }
        assert "x-ratelimit-remaining-requests" in added, added
        usage = b'{"usage":{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5}}'
        await call.response_body(usage)
        await call.close()
        answers = await process.call().request(chat_body(MODEL), headers=key)
        status, headers, body = immediate(answers[-1])
        assert status == 429, body
        assert "retry-after" in headers and "x-ratelimit-limit-requests" in headers
        async with aiohttp.ClientSession() as session:
            async with session.get(admin_url + "/metrics") as response:
                text = await response.text()
        assert 'headcount_tenant_tokens_total{kind="completion",tenant="capped"} 5.0' in text, [
            line for line in text.splitlines() if "tenant_tokens" in line
        ]


async def test_a_stored_response_is_found_on_the_engine_that_answered_its_create(
    tmp_path: Path,
) -> None:
    async with engines(3) as sims, picker(tmp_path, [s.url for s in sims]) as (process, _):
        call = process.call()
        create = json.dumps({"model": MODEL, "input": "hi"}).encode()
        answers = await call.request(create, path="/v1/responses")
        creator = destination(answers[0])[0]
        head = await call.respond(200, creator)
        assert not head.HasField("mode_override")  # the id is read from the body
        await call.response_body(b'{"id":"resp_0123456789abcdef","object":"response"}')
        await call.close()
        for _ in range(3):
            call = process.call()
            await call.send_headers("/v1/responses/resp_0123456789abcdef", method="GET", end=True)
            assert destination(await call.read()) == (creator, creator)
