"""Engines behind TLS: simulated engines serving https, certificates made per test (trustme).

A CA the router is told to trust, one it is not, engine certificates naming
only a host name (as a mesh's do, no pod IP), and a client CA for engines that
require the router's certificate. Most tests run `headcount serve` as a child
process and judge it from outside: answers through it, and `/engines`, whose
state and `last_error` say why an engine is not routed to. The data plane's
dialling and kv-aware's `/tokenize` calls are also driven in this process.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme

from headcount._http.errors import ConnectFailed
from headcount._http.pool import PoolOptions, UpstreamPool
from headcount._http.resolve import Resolver
from headcount._http.tls import build_engine_tls
from headcount.config import DiscoveryMode, EngineScheme, EngineTlsSettings
from headcount.sim.apiserver import make_endpointslice, make_service
from headcount.sim.cluster import (
    PYTHON_CLI,
    RouterFlags,
    RouterProcess,
    Timings,
    hosts,
    sim_cluster,
    wait_until,
)
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine, start_engine
from tests.support.kv_event_index import EventIndex
from tests.support.kv_routed import BS, ENGINES, QUESTIONS, ask, kv_policy, record
from tests.support.routed import CHAT, routed

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

MODEL = "sim-model"
HOST = "127.0.0.1"
FAST = Timings(probe_interval=0.2, probe_timeout=2.0, drain_delay=0.0)


@dataclass(frozen=True)
class Pem:
    """A certificate and its key, written where an engine or the router reads them."""

    cert: Path
    key: Path


def write_cert(cert: trustme.LeafCert, directory: Path, name: str) -> Pem:
    pem = Pem(directory / f"{name}.crt", directory / f"{name}.key")
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem.cert))
    cert.private_key_pem.write_to_path(str(pem.key))
    return pem


def write_ca(ca: trustme.CA, directory: Path, name: str) -> Path:
    path = directory / f"{name}-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def tls_engine(pem: Pem, *, client_ca: Path | None = None, host: str = HOST) -> EngineSimConfig:
    return EngineSimConfig(
        host=host,
        model=MODEL,
        tls_cert=str(pem.cert),
        tls_key=str(pem.key),
        tls_client_ca=None if client_ca is None else str(client_ca),
    )


@asynccontextmanager
async def router(flags: RouterFlags) -> AsyncIterator[RouterProcess]:
    async with RouterProcess(flags) as process:
        yield process


def static(*backends: str, **tls: Any) -> RouterFlags:
    return RouterFlags(discovery=DiscoveryMode.STATIC, backends=backends, timings=FAST, **tls)


async def engine_states(process: RouterProcess) -> list[tuple[str, str | None]]:
    return [(e["state"], e["last_error"]) for e in await process.client.engines()]


async def wait_unhealthy(process: RouterProcess) -> str:
    """The engine's last error once it is unhealthy (with the reason the probe gave)."""
    found: list[str] = []

    async def unhealthy() -> bool:
        states = await engine_states(process)
        found[:] = [error or "" for state, error in states if state == "unhealthy"]
        return bool(found)

    await wait_until(unhealthy, timeout=10, what="the engine unhealthy")
    return found[0]


async def streamed_text(url: str) -> str:
    """A streaming chat through the router: the content of its chunks, `[DONE]` checked."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    pieces: list[str] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.post(
            url + "/v1/chat/completions", json={**body, "stream": True}
        ) as response:
            assert response.status == 200, await response.text()
            events = (await response.text()).split("\n\n")
    data = [event.removeprefix("data: ") for event in events if event.startswith("data: ")]
    assert data[-1] == "[DONE]", data
    for chunk in data[:-1]:
        for choice in json.loads(chunk)["choices"]:
            pieces.append(choice["delta"].get("content") or "")
    return "".join(pieces)


async def test_an_https_engine_is_probed_and_serves_chat_and_streams(
    ca: trustme.CA, tmp_path: Path
) -> None:
    pem = write_cert(ca.issue_cert(HOST), tmp_path, "engine")
    async with running_engine(tls_engine(pem)) as engine:
        assert engine.url.startswith("https://")
        flags = static(engine.url, engine_tls_ca_file=write_ca(ca, tmp_path, "engines"))
        async with router(flags) as process:
            await wait_until(lambda: process.client.routable(MODEL), timeout=10)
            assert await engine_states(process) == [("ready", None)]
            status, answer = await process.client.chat(MODEL)
            assert status == 200 and answer["choices"][0]["message"]["content"]
            assert await streamed_text(process.url)
            served = engine.stats()["served"]
        assert isinstance(served, int) and served >= 3, served


async def test_an_engine_whose_certificate_does_not_verify_is_not_routed_to(
    ca: trustme.CA, tmp_path: Path
) -> None:
    stranger = write_cert(trustme.CA().issue_cert(HOST), tmp_path, "stranger")
    async with running_engine(tls_engine(stranger)) as engine:
        flags = static(engine.url, engine_tls_ca_file=write_ca(ca, tmp_path, "engines"))
        async with router(flags) as process:
            error = await wait_unhealthy(process)
            assert "certificate verify failed" in error, error
            status, body = await process.client.chat(MODEL)
            assert status == 503, body
        assert engine.stats()["served"] == 0


async def test_the_server_name_is_the_engines_host_name_or_the_override(
    ca: trustme.CA, tmp_path: Path
) -> None:
    """A certificate naming only `engine.test`: reached by that name (SNI and check from the
    URL), or by IP with `--engine-tls-server-name engine.test`; by IP alone it fails."""
    pem = write_cert(ca.issue_cert("engine.test"), tmp_path, "named")
    trusted = write_ca(ca, tmp_path, "engines")
    async with running_engine(tls_engine(pem)) as engine:
        by_name = RouterFlags(
            discovery=DiscoveryMode.STATIC,
            backends=(f"https://engine.test:{engine.port}",),
            resolve=(f"engine.test={HOST}",),
            engine_tls_ca_file=trusted,
            timings=FAST,
        )
        async with router(by_name) as process:
            await wait_until(lambda: process.client.routable(MODEL), timeout=10)
        overridden = static(
            engine.url, engine_tls_ca_file=trusted, engine_tls_server_name="engine.test"
        )
        async with router(overridden) as process:
            await wait_until(lambda: process.client.routable(MODEL), timeout=10)
        async with router(static(engine.url, engine_tls_ca_file=trusted)) as process:
            error = await wait_unhealthy(process)
            assert "certificate verify failed" in error and "127.0.0.1" in error, error


async def test_an_engine_that_requires_a_client_certificate_gets_the_routers(
    ca: trustme.CA, tmp_path: Path
) -> None:
    clients = trustme.CA()
    pem = write_cert(ca.issue_cert(HOST), tmp_path, "engine")
    mine = write_cert(clients.issue_cert("router"), tmp_path, "router")
    config = tls_engine(pem, client_ca=write_ca(clients, tmp_path, "clients"))
    trusted = write_ca(ca, tmp_path, "engines")
    async with running_engine(config) as engine:
        with_cert = static(
            engine.url,
            engine_tls_ca_file=trusted,
            engine_tls_cert_file=mine.cert,
            engine_tls_key_file=mine.key,
        )
        async with router(with_cert) as process:
            await wait_until(lambda: process.client.routable(MODEL), timeout=10)
        async with router(static(engine.url, engine_tls_ca_file=trusted)) as process:
            error = await wait_unhealthy(process)
            assert "Server disconnected: no client certificate was sent" in error, error
            status, body = await process.client.chat(MODEL)
            assert status == 503, body


async def test_pods_are_reached_over_https_with_engine_scheme_https(
    ca: trustme.CA, tmp_path: Path
) -> None:
    """`--engine-scheme https` against the emulated API server: pod IPs, which the
    certificate does not name, verified as `--engine-tls-server-name`."""
    pem = write_cert(ca.issue_cert("engine.llm.svc"), tmp_path, "engine")
    addresses = ["127.0.3.1", "127.0.3.2"]
    async with sim_cluster(tmp_path, addresses) as cluster:
        engines: list[SimEngine] = []
        for number, address in enumerate(addresses):
            config = tls_engine(pem, host=address)
            engine = await start_engine(replace(config, port=cluster.port, name=f"p{number}"))
            cluster.engines[f"p{number}"] = engine
            cluster.apply_pod(f"p{number}", address, model=MODEL)
            engines.append(engine)
        tls = replace(
            cluster.router_flags(FAST),
            engine_scheme=EngineScheme.HTTPS,
            engine_tls_ca_file=write_ca(ca, tmp_path, "engines"),
            engine_tls_server_name="engine.llm.svc",
        )
        async with router(tls) as process:

            async def both_ready() -> bool:
                return await engine_states(process) == [("ready", None)] * 2

            await wait_until(both_ready, timeout=10, what="both pods ready over https")
            urls = sorted(e["url"] for e in await process.client.engines())
            assert urls == [f"https://{a}:{cluster.port}" for a in addresses]
            for _ in range(4):
                status, body = await process.client.chat(MODEL)
                assert status == 200, body
        assert all(engine.stats()["served"] != 0 for engine in engines)


async def test_a_service_whose_port_declares_https_is_reached_over_https(
    ca: trustme.CA, tmp_path: Path
) -> None:
    """`appProtocol: https` on the Service's port, no `--engine-scheme`: the engine is https
    and its certificate is checked against the Service's name, sent as SNI."""
    (address,) = hosts("127.0.14", 1)
    async with sim_cluster(tmp_path, [address]) as cluster:
        name = f"vllm.{cluster.namespace}"
        pem = write_cert(ca.issue_cert(name), tmp_path, "service")
        cluster.engines["vllm"] = await start_engine(
            replace(tls_engine(pem, host=address), port=cluster.port)
        )
        service = make_service(
            "vllm", namespace=cluster.namespace, labels={"app": "engine"}, ports=[cluster.port]
        )
        service["spec"]["ports"][0]["appProtocol"] = "https"
        cluster.api.apply_service(service)
        cluster.api.apply_endpointslice(
            make_endpointslice("vllm", [(address, True)], cluster.port, namespace=cluster.namespace)
        )
        flags = replace(
            cluster.router_flags(FAST),
            discovery=DiscoveryMode.K8S_SERVICES,
            resolve=(f"{name}={address}",),
            engine_tls_ca_file=write_ca(ca, tmp_path, "engines"),
        )
        async with router(flags) as process:
            await wait_until(lambda: process.client.routable(MODEL), timeout=10)
            [engine] = await process.client.engines()
            assert engine["url"] == f"https://{name}:{cluster.port}"


def engine_pool(url: str, ca_file: Path) -> UpstreamPool:
    tls = build_engine_tls(EngineTlsSettings(ca_file=ca_file))
    options = PoolOptions(
        connect_timeout=2.0,
        read_timeout=5.0,
        idle_timeout=4.0,
        max_idle=4,
        max_head_size=64 * 1024,
        resolver=Resolver(0.5),
        tls=tls,
    )
    return UpstreamPool(url, options)


async def test_the_data_plane_dials_https_engines_and_names_a_failed_verification(
    ca: trustme.CA, tmp_path: Path
) -> None:
    trusted = write_ca(ca, tmp_path, "engines")
    good = write_cert(ca.issue_cert(HOST), tmp_path, "engine")
    stranger = write_cert(trustme.CA().issue_cert(HOST), tmp_path, "stranger")
    async with running_engine(tls_engine(good)) as engine:
        connection = await engine_pool(engine.url, trusted).connect()
        assert not connection.closed
        connection.close()
    async with running_engine(tls_engine(stranger)) as engine:
        with pytest.raises(ConnectFailed) as failed:
            await engine_pool(engine.url, trusted).connect()
    assert str(failed.value) == (
        "TLS handshake failed: certificate verify failed: unable to get local issuer certificate"
    )


async def test_kv_aware_asks_an_https_engines_tokenize_over_tls(
    ca: trustme.CA, tmp_path: Path
) -> None:
    """With no router tokenizer, the prompt's ids come from the engines' `/tokenize`, on the
    proxy's pools: over TLS, so warm requests are predicted cached as the engine reports."""
    pem = write_cert(ca.issue_cert(HOST), tmp_path, "engine")
    configs = [replace(c, tls_cert=str(pem.cert), tls_key=str(pem.key)) for c in ENGINES]
    tls = build_engine_tls(EngineTlsSettings(ca_file=write_ca(ca, tmp_path, "engines")))
    index = EventIndex(BS)
    async with routed(*configs, policy=kv_policy(index, None), engine_tls=tls) as setup:
        assert all(url.startswith("https://") for url in setup.engine_ids)
        record(setup, index)
        predicted, reported = [], []
        for question in QUESTIONS:
            status, body, headers = await setup.post(CHAT, ask(question))
            assert status == 200, body
            predicted.append(int(headers["x-headcount-cached-tokens"]))
            reported.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert predicted == reported and all(tokens > 150 for tokens in predicted[1:]), predicted


def test_an_unusable_certificate_file_stops_serve_with_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    result = subprocess.run(
        [
            *PYTHON_CLI,
            "serve",
            "--host=127.0.0.1",
            "--port=0",
            "--backends=https://127.0.0.1:1",
            f"--engine-tls-ca-file={junk}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "error:" in line]
    assert line.endswith(f"--engine-tls-ca-file {junk}: no PEM certificate in it"), line
