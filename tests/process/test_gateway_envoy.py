"""headcount as the endpoint picker of a real Envoy, run from deploy/gateway/envoy.yaml.

Clients talk to Envoy only. Its ext_proc filter asks `headcount serve
--ext-proc-port` (a child process) where each request goes, and its
ORIGINAL_DST cluster connects to the `ip:port` headcount answered in
`x-gateway-destination-endpoint`. Simulated engines on loopback addresses
name themselves in `x-engine-name`; the route adds what was picked and where
Envoy connected (tests/support/envoy.py), so every answer shows that the
engine that served is the one headcount picked. Failures of the picker itself
are judged by Envoy's status and its admin stats; every request has a timeout,
so a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme

from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import RouterFlags, RouterProcess, Timings, hosts, sim_cluster
from headcount.sim.engine import EngineSimConfig, SimEngine, running_engine
from headcount.sim.engine.kv_events_config import KvEventsConfig
from headcount.sim.loopback import free_port, free_port_on_all
from tests.support import blackholed_listener, wait_until
from tests.support.envoy import (
    FULL_DUPLEX,
    PICKED,
    UPSTREAM,
    Envoy,
    GatewayConfig,
    PickerTls,
    subset_hint_filter,
)

__all__: list[str] = []

pytestmark = pytest.mark.timeout(90)

MODEL = "sim-model"
BLOCK = 16
TIMEOUT = 10.0
"""Every request's bound: an answer that takes longer is a hang."""
FAST = Timings(probe_interval=0.2, probe_timeout=1.0, connect_timeout=0.3, drain_delay=0)
DESTINATION = "x-gateway-destination-endpoint"
PICKER_NAME = "headcount.test"
"""The name headcount's ext_proc certificate carries and Envoy checks."""
BUFFERED = GatewayConfig(picker_port=0, request_body_mode="BUFFERED", response_body_mode="STREAMED")
"""The example's other pair of body modes: the request whole, the response piece by piece."""


# ---------------------------------------------------------------- the gateway


@dataclass(frozen=True)
class Answer:
    """One answer through Envoy: its status, the engine that served it, what was picked."""

    status: int
    engine: str | None
    picked: str | None
    upstream: str | None
    body: str


@dataclass
class Gateway:
    """Engines by name, headcount picking for them, Envoy in front, a client session."""

    engines: dict[str, SimEngine]
    router: RouterProcess
    envoy: Envoy
    session: aiohttp.ClientSession

    def endpoint(self, name: str) -> str:
        engine = self.engines[name]
        return f"{engine.config.host}:{engine.port}"

    def name_at(self, endpoint: str) -> str:
        return next(name for name in self.engines if self.endpoint(name) == endpoint)

    async def chat(
        self,
        *,
        content: str = "hello",
        system: str | None = None,
        max_tokens: int = 2,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        messages = [{"role": "user", "content": content}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
        url = self.envoy.url + "/v1/chat/completions"
        async with self.session.post(url, json=body, headers=headers) as response:
            text = await response.text()
            return Answer(
                response.status,
                response.headers.get("x-engine-name"),
                response.headers.get(PICKED),
                response.headers.get(UPSTREAM),
                text,
            )

    async def served(self, **chat: Any) -> str:
        """Send a chat; the name of the engine that served it, checked to be the one picked."""
        answer = await self.chat(**chat)
        assert answer.status == 200, f"{answer}\n{self.router.log()}"
        assert answer.engine is not None
        assert answer.picked == answer.upstream == self.endpoint(answer.engine), answer
        return answer.engine


def picker(
    flags: RouterFlags,
    ext_proc_port: int,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    alone: bool = False,
) -> RouterProcess:
    """`headcount serve` with its ext_proc port beside its own HTTP port or, `alone`, in its
    place (`--port off`: the port `router.url` names is then the admin port)."""
    router = RouterProcess(flags)
    router.command += [f"--ext-proc-port={ext_proc_port}"]
    if alone:
        router.command += ["--port=off", f"--admin-port={router.port}"]
    if cert is not None and key is not None:
        router.command += [f"--ext-proc-tls-cert={cert}", f"--ext-proc-tls-key={key}"]
    return router


async def all_ready(router: RouterProcess, count: int) -> bool:
    engines = await router.client.engines()
    return len(engines) == count and all(engine["state"] == "ready" for engine in engines)


@contextlib.asynccontextmanager
async def gateway(
    directory: Path,
    engines: Sequence[EngineSimConfig],
    flags: RouterFlags,
    config: GatewayConfig | None = None,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    expected: int = 0,
    alone: bool = False,
) -> AsyncIterator[Gateway]:
    """The engines, headcount (static discovery unless `flags` say otherwise) picking for
    them, and Envoy rendered with `config` (its picker port filled in), all ready: `expected`
    engines ready in headcount when discovery finds engines started elsewhere."""
    async with contextlib.AsyncExitStack() as stack:
        running = {
            str(each.name): await stack.enter_async_context(running_engine(each))
            for each in engines
        }
        if flags.discovery is DiscoveryMode.STATIC:
            flags = replace(flags, backends=tuple(engine.url for engine in running.values()))
        port = free_port()
        router = await stack.enter_async_context(
            picker(flags, port, cert=cert, key=key, alone=alone)
        )
        await wait_until(
            lambda: all_ready(router, expected or len(running)),
            timeout=TIMEOUT,
            what="every engine ready",
        )
        config = replace(config or GatewayConfig(picker_port=0), picker_port=port)
        envoy = await stack.enter_async_context(Envoy(config, directory))
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        )
        yield Gateway(running, router, envoy, session)


def engine_configs(
    prefix: str, count: int, *, token_delay: float = 0.0, kv: tuple[int, int] | None = None
) -> list[EngineSimConfig]:
    """`count` engines named a, b, ... on loopback addresses `prefix`.1 onwards, one port;
    with `kv` (the KV-event ports), a prefix cache that publishes its events."""
    addresses = hosts(prefix, count)
    port = free_port_on_all(addresses)
    return [
        EngineSimConfig(
            host=host,
            port=port,
            model=MODEL,
            name=chr(ord("a") + index),
            token_delay=token_delay,
            kv_blocks=None if kv is None else 600,
            block_size=BLOCK,
            prefill_tokens_per_s=1_000_000.0,
            kv_events=None if kv is None else KvEventsConfig(kv[0], replay_port=kv[1]),
        )
        for index, host in enumerate(addresses)
    ]


def static_flags(routing: RoutingName = RoutingName.ROUND_ROBIN) -> RouterFlags:
    tokenizer = "builtin" if routing is RoutingName.KV_AWARE else None
    return RouterFlags(
        discovery=DiscoveryMode.STATIC, routing=routing, tokenizer=tokenizer, timings=FAST
    )


# ---------------------------------------------------------------- the example itself


@pytest.mark.parametrize("buffered", [False, True], ids=["streamed", "buffered"])
@pytest.mark.parametrize("failure_mode_allow", [False, True], ids=["fail-close", "fail-open"])
def test_the_example_is_a_valid_envoy_configuration(
    tmp_path: Path, buffered: bool, failure_mode_allow: bool
) -> None:
    config = replace(
        BUFFERED if buffered else GatewayConfig(picker_port=0),
        picker_port=9002,
        failure_mode_allow=failure_mode_allow,
    )
    result = Envoy(config, tmp_path).validate()
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_example_with_tls_to_the_picker_is_a_valid_envoy_configuration(
    tmp_path: Path,
) -> None:
    ca_file = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca_file))
    config = GatewayConfig(picker_port=9002, tls=PickerTls(ca_file, PICKER_NAME))
    result = Envoy(config, tmp_path).validate()
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- headcount down


@pytest.mark.parametrize(
    ("buffered", "failure_mode_allow", "status", "stat"),
    [
        (False, False, 500, "http.inference.ext_proc.streams_failed"),
        (True, False, 500, "http.inference.ext_proc.streams_failed"),
        (False, True, 500, "http.inference.ext_proc.streams_failed"),
        (True, True, 503, "cluster.picked_engine.upstream_cx_none_healthy"),
    ],
    ids=["streamed-fail-close", "buffered-fail-close", "streamed-fail-open", "buffered-fail-open"],
)
async def test_with_headcount_down_envoy_answers_at_once_as_its_failure_mode_says(
    tmp_path: Path, buffered: bool, failure_mode_allow: bool, status: int, stat: str
) -> None:
    """FailClose: 500. FailOpen goes on without a pick only with a buffered body, and with no
    address for ORIGINAL_DST that is 503; with a streamed body Envoy fails closed anyway."""
    config = replace(
        BUFFERED if buffered else GatewayConfig(picker_port=0),
        picker_port=free_port(),
        failure_mode_allow=failure_mode_allow,
    )
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    async with Envoy(config, tmp_path) as envoy, aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(3):
            started = time.monotonic()
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(envoy.url + "/v1/chat/completions", json=body) as response:
                await response.read()
                assert response.status == status
            assert time.monotonic() - started < 2.0, "Envoy waited for a picker that is down"
        assert await envoy.stat(stat) == 3
        if failure_mode_allow and buffered:
            assert await envoy.stat("http.inference.ext_proc.failure_mode_allowed") == 3


# ---------------------------------------------------------------- requests land where picked


async def test_round_robin_requests_land_on_each_engine_headcount_picked(tmp_path: Path) -> None:
    async with gateway(tmp_path, engine_configs("127.0.21", 3), static_flags()) as through:
        served = [await through.served() for _ in range(6)]
        assert await through.envoy.stat("cluster.headcount_picker.health_check.success") >= 1
        assert await through.envoy.stat("cluster.headcount_picker.membership_healthy") == 1
    assert sorted(served) == ["a", "a", "b", "b", "c", "c"]


async def test_a_client_cannot_steer_envoy_with_its_own_destination_header(
    tmp_path: Path,
) -> None:
    """The header ORIGINAL_DST follows is headcount's alone: a client's is overwritten."""
    flags = static_flags(RoutingName.SESSION)
    async with gateway(tmp_path, engine_configs("127.0.37", 3), flags) as through:
        picked = await through.served(headers={"x-session-id": "alice"})
        elsewhere = next(name for name in through.engines if name != picked)
        steering = {"x-session-id": "alice", DESTINATION: through.endpoint(elsewhere)}
        served = [await through.served(headers=steering) for _ in range(3)]
    assert served == [picked] * 3


async def test_a_picker_without_an_openai_port_serves_envoy(tmp_path: Path) -> None:
    """The gateway overlay's mode: `--port off`, the ext_proc port and the admin port only."""
    engines = engine_configs("127.0.35", 2)
    async with gateway(tmp_path, engines, static_flags(), alone=True) as through:
        served = [await through.served() for _ in range(4)]
        assert await through.router.client.status_of("/v1/models") == 404, "no OpenAI API"
    assert sorted(served) == ["a", "a", "b", "b"]


async def test_a_buffered_body_is_picked_for_as_a_streamed_one(tmp_path: Path) -> None:
    async with gateway(
        tmp_path, engine_configs("127.0.22", 2), static_flags(), BUFFERED
    ) as through:
        served = [await through.served() for _ in range(4)]
    assert sorted(served) == ["a", "a", "b", "b"]


async def test_a_buffered_request_with_a_full_duplex_response_is_answered(tmp_path: Path) -> None:
    config = replace(BUFFERED, response_body_mode=FULL_DUPLEX)
    async with gateway(tmp_path, engine_configs("127.0.34", 2), static_flags(), config) as through:
        served = [await through.served() for _ in range(2)]
    assert sorted(served) == ["a", "b"]


async def test_least_loaded_keeps_requests_off_the_engine_busy_with_a_long_stream(
    tmp_path: Path,
) -> None:
    """The picker counts what Envoy sends: an answer still streaming keeps its engine busy.
    Probed once only: a scrape taken during a short answer would count it as running on its
    engine until the next scrape, a tie with the busy engine that round-robin may break."""
    engines = engine_configs("127.0.23", 2, token_delay=0.05)
    flags = replace(
        static_flags(RoutingName.LEAST_LOADED), timings=replace(FAST, probe_interval=60.0)
    )
    async with gateway(tmp_path, engines, flags) as through:
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 40, "stream": True}
        body["messages"] = [{"role": "user", "content": "long"}]
        url = through.envoy.url + "/v1/chat/completions"
        async with through.session.post(url, json=body) as long_stream:
            assert long_stream.status == 200
            busy = long_stream.headers["x-engine-name"]
            await long_stream.content.readline()
            short = [await through.served(max_tokens=1) for _ in range(4)]
            assert not long_stream.content.at_eof(), "the long stream must still be running"
            await long_stream.read()
    assert busy not in short, f"picked the busy engine {busy}: {short}"


async def test_session_keeps_each_session_on_one_engine(tmp_path: Path) -> None:
    flags = static_flags(RoutingName.SESSION)
    async with gateway(tmp_path, engine_configs("127.0.24", 3), flags) as through:
        by_session = {
            session: {await through.served(headers={"x-session-id": session}) for _ in range(3)}
            for session in ("alice", "bob", "carol", "dave", "erin", "frank")
        }
    assert all(len(engines) == 1 for engines in by_session.values()), by_session
    assert len(set.union(*by_session.values())) > 1, "every session on one engine"


async def test_prefix_keeps_each_prompt_on_one_engine(tmp_path: Path) -> None:
    flags = static_flags(RoutingName.PREFIX)
    async with gateway(tmp_path, engine_configs("127.0.25", 3), flags) as through:
        by_prompt = {
            tag: {
                await through.served(system=system_prompt(tag), content=f"q{n}") for n in range(3)
            }
            for tag in ("one", "two", "three", "four", "five", "six")
        }
    assert all(len(engines) == 1 for engines in by_prompt.values()), by_prompt
    assert len(set.union(*by_prompt.values())) > 1, "every prompt on one engine"


# ---------------------------------------------------------------- kv-aware


def system_prompt(tag: str, blocks: int = 12) -> str:
    """A long system prompt, different for each `tag` from its first token."""
    return f"{tag}: " + " ".join(f"w{tag}{n}" for n in range(blocks * BLOCK))


async def prefix_cache_hits(session: aiohttp.ClientSession, engine: SimEngine) -> float:
    async with session.get(engine.url + "/metrics") as response:
        text = await response.text()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("vllm:prefix_cache_hits_total")
    )


async def test_kv_aware_through_envoy_hits_the_cache_as_it_does_directly(tmp_path: Path) -> None:
    """A prompt cached on one engine (sent there directly) is routed there through Envoy, as
    through headcount's own data plane: both hit the engine's prefix cache."""
    addresses = hosts("127.0.26", 2)
    kv = (free_port_on_all(addresses), free_port_on_all(addresses))
    engines = engine_configs("127.0.26", 2, kv=kv)
    flags = replace(
        static_flags(RoutingName.KV_AWARE), kv_events_port=kv[0], kv_events_replay_port=kv[1]
    )
    async with gateway(tmp_path, engines, flags) as through:
        for tag, name in (("left", "a"), ("right", "b")):
            system = system_prompt(tag)
            engine = through.engines[name]
            body: dict[str, Any] = {"model": MODEL, "max_tokens": 2}
            body["messages"] = [
                {"role": "system", "content": system},
                {"role": "user", "content": "warm up"},
            ]
            async with through.session.post(engine.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200

            async def indexed(engine_url: str = engine.url) -> bool:
                views = await through.router.client.engines()
                [view] = [each for each in views if each["url"] == engine_url]
                return int(view["kv_index"]["blocks"]) >= 12

            await wait_until(indexed, timeout=TIMEOUT, what=f"{name}'s cache indexed")
            hits = await prefix_cache_hits(through.session, engine)
            assert await through.served(system=system, content="through envoy") == name
            through_envoy = await prefix_cache_hits(through.session, engine)
            assert through_envoy > hits, "the request through Envoy missed the cache"
            direct_url = through.router.url + "/v1/chat/completions"
            body["messages"][1]["content"] = "through headcount"
            async with through.session.post(direct_url, json=body) as response:
                assert response.status == 200
                assert response.headers["x-headcount-engine"] == engine.url
            assert await prefix_cache_hits(through.session, engine) > through_envoy


# ---------------------------------------------------------------- streaming


@pytest.mark.parametrize("buffered", [False, True], ids=["full-duplex", "buffered"])
async def test_a_stream_reaches_the_client_token_by_token_through_envoy(
    tmp_path: Path, buffered: bool
) -> None:
    """The first chunk arrives while the engine is still generating (20 tokens, 0.1 s each),
    whether the response body passes through headcount (full duplex) or is skipped (the
    picker's `mode_override`, which Envoy honours with BUFFERED and STREAMED)."""
    engines = engine_configs("127.0.27", 1, token_delay=0.1)
    config = BUFFERED if buffered else None
    async with gateway(tmp_path, engines, static_flags(), config) as through:
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 20, "stream": True}
        body["messages"] = [{"role": "user", "content": "count"}]
        started = time.monotonic()
        async with through.session.post(through.envoy.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            first = await r.content.readline()
            first_at = time.monotonic() - started
            rest = await r.read()
        ended_at = time.monotonic() - started
        sent = await through.envoy.stat("http.inference.ext_proc.stream_msgs_sent")
    assert first.startswith(b"data: ")
    assert b"data: [DONE]" in rest
    assert ended_at >= 2.0, "the engine generated 20 tokens at 0.1 s each"
    assert first_at < 1.0, f"the first chunk came after {first_at:.2f} s: buffered"
    if buffered:
        assert sent == 3, "request headers, request body, response headers: the rest skipped"
    else:
        assert sent > 20, "every chunk of the answer goes through headcount"


@pytest.mark.parametrize("buffered", [False, True], ids=["full-duplex", "buffered"])
@pytest.mark.parametrize("asks", [False, True], ids=["not-asked", "asked"])
async def test_a_stream_carries_usage_only_when_its_client_asked(
    tmp_path: Path, buffered: bool, asks: bool
) -> None:
    """With a tenants file, flow control asks the engine for usage to settle the tokens; the
    client gets the usage event only if it asked for one itself, as from the data plane."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("[default]\ntokens_per_minute = 1000000\n")
    flags = replace(static_flags(), tenants_file=tenants)
    config = BUFFERED if buffered else None
    async with gateway(tmp_path, engine_configs("127.0.36", 1), flags, config) as through:
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "stream": True}
        body["messages"] = [{"role": "user", "content": "count"}]
        if asks:
            body["stream_options"] = {"include_usage": True}
        url = through.envoy.url + "/v1/chat/completions"
        async with through.session.post(url, json=body) as answer:
            assert answer.status == 200
            text = await answer.read()
    events = [line for line in text.split(b"\n") if line.startswith(b"data: {")]
    usage = [event for event in events if b'"usage":{' in event]
    assert text.endswith(b"data: [DONE]\n\n"), text[-200:]
    assert len(events) >= 8, text
    assert len(usage) == (1 if asks else 0), usage


# ---------------------------------------------------------------- engines that go away


async def test_an_engine_that_dies_is_routed_around_and_no_request_hangs(tmp_path: Path) -> None:
    """Envoy does not fail over (ORIGINAL_DST goes where the header says), so requests the
    picker sent to the dead engine before it knew fail at once (503); the outcomes Envoy
    reports eject it after `--outlier-consecutive-errors` (5) failures, if its probes have
    not taken it out before, and every request then lands on the other."""
    async with gateway(tmp_path, engine_configs("127.0.28", 2), static_flags()) as through:
        assert {await through.served() for _ in range(2)} == {"a", "b"}
        await through.engines["b"].stop()
        answers = []
        for _ in range(60):
            started = time.monotonic()
            answers.append(await through.chat())
            assert time.monotonic() - started < 3.0, "a request waited on the dead engine"
            if [answer.status for answer in answers[-10:]] == [200] * 10:
                break
        assert [answer.status for answer in answers[-10:]] == [200] * 10, answers
        assert {answer.status for answer in answers} <= {200, 503}, answers
        assert sum(answer.status == 503 for answer in answers) <= 5, answers
        assert {answer.engine for answer in answers if answer.status == 200} == {"a"}
        after = [await through.served() for _ in range(5)]
    assert after == ["a"] * 5


async def test_a_pod_deleted_while_the_api_is_unreachable_is_never_picked_after_the_relist(
    tmp_path: Path,
) -> None:
    """Its engine goes on answering, so only the picker's view can keep requests off it."""
    stays_ip, goes_ip = hosts("127.0.29", 2)
    async with sim_cluster(tmp_path, [stays_ip, goes_ip], namespace="llm") as cluster:
        await cluster.add_engine("stays", stays_ip, model=MODEL)
        await cluster.add_engine("goes", goes_ip, model=MODEL)
        timings = replace(
            FAST,
            backoff_initial=0.05,
            backoff_max=0.5,
            api_request_timeout=1,
            api_connect_timeout=0.5,
            watch_idle_timeout=2,
        )
        flags = replace(cluster.router_flags(timings), routing=RoutingName.ROUND_ROBIN)
        async with gateway(tmp_path, [], flags, expected=2) as through:
            through.engines.update(cluster.engines)
            assert {await through.served() for _ in range(2)} == {"stays", "goes"}
            await cluster.api.refuse()

            async def blind() -> bool:
                health = await through.router.client.health()
                return health["sources"][0]["watch_connected"] is False

            await wait_until(blind, timeout=TIMEOUT, what="the picker blind")
            cluster.api.delete_pod("llm", "goes")
            await cluster.api.restore()

            async def ghost_gone() -> bool:
                return "goes" not in await through.router.client.engines_by_name()

            await wait_until(ghost_gone, timeout=TIMEOUT, what="the deleted pod's engine gone")
            served = [await through.served() for _ in range(10)]
    assert served == ["stays"] * 10


# ---------------------------------------------------------------- the subset hint


async def test_the_picker_picks_only_inside_the_subset_envoy_hints(tmp_path: Path) -> None:
    engines = engine_configs("127.0.30", 3)
    allowed = [f"{each.host}:{each.port}" for each in engines[:2]]
    config = GatewayConfig(picker_port=0, before_picker=(subset_hint_filter(allowed),))
    async with gateway(tmp_path, engines, static_flags(), config) as through:
        served = [await through.served() for _ in range(6)]
    assert sorted(served) == ["a", "a", "a", "b", "b", "b"]


async def test_a_subset_without_an_eligible_engine_is_refused_with_503(tmp_path: Path) -> None:
    engines = engine_configs("127.0.31", 2)
    nowhere = f"127.0.31.99:{engines[0].port}"
    config = GatewayConfig(picker_port=0, before_picker=(subset_hint_filter([nowhere]),))
    async with gateway(tmp_path, engines, static_flags(), config) as through:
        answer = await through.chat()
        assert answer.status == 503, answer
        assert answer.engine is None, "no engine may have answered"
        assert "error" in json.loads(answer.body), "OpenAI's error shape"


# ---------------------------------------------------------------- TLS to the picker


def picker_certificate(directory: Path, ca: trustme.CA) -> tuple[Path, Path]:
    """headcount's ext_proc certificate for PICKER_NAME and its key, issued by `ca`."""
    leaf = ca.issue_cert(PICKER_NAME)
    cert, key = directory / "picker.crt", directory / "picker.key"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    return cert, key


async def test_envoy_reaches_the_picker_over_tls_trusting_its_ca(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = picker_certificate(tmp_path, ca)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    config = GatewayConfig(picker_port=0, tls=PickerTls(ca_file, PICKER_NAME))
    engines = engine_configs("127.0.32", 2)
    async with gateway(tmp_path, engines, static_flags(), config, cert=cert, key=key) as through:
        served = [await through.served() for _ in range(4)]
        assert await through.envoy.stat("cluster.headcount_picker.ssl.handshake") >= 1
    assert sorted(served) == ["a", "a", "b", "b"]


async def test_envoy_refuses_a_picker_whose_certificate_it_does_not_trust(tmp_path: Path) -> None:
    cert, key = picker_certificate(tmp_path, trustme.CA())
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    config = GatewayConfig(picker_port=0, tls=PickerTls(other_ca, PICKER_NAME))
    engines = engine_configs("127.0.33", 1)
    async with gateway(tmp_path, engines, static_flags(), config, cert=cert, key=key) as through:
        answer = await through.chat()
        assert answer.status == 500, answer
        assert answer.engine is None
        assert await through.envoy.stat("cluster.headcount_picker.ssl.fail_verify_error") >= 1


# ---------------------------------------------------------------- the gateway overlay's mode


async def test_the_pools_picker_follows_a_selector_change_behind_envoy(tmp_path: Path) -> None:
    """As deploy/overlays/gateway runs it: `--discovery inference-pool`, `--port off`."""
    first_ip, second_ip = hosts("127.0.36", 2)
    async with sim_cluster(tmp_path, [first_ip, second_ip], namespace="llm") as cluster:
        for name, ip, group in (("first", first_ip, "one"), ("second", second_ip, "two")):
            await cluster.start_engine(name, ip, model=MODEL)
            cluster.apply_pod(name, ip, model=MODEL, labels={"group": group})
        cluster.apply_inference_pool("engines", match_labels={"group": "one"})
        flags = replace(cluster.pool_router_flags("engines", FAST), routing=RoutingName.ROUND_ROBIN)
        async with gateway(tmp_path, [], flags, expected=1, alone=True) as through:
            through.engines.update(cluster.engines)
            assert [await through.served() for _ in range(3)] == ["first"] * 3
            cluster.patch_inference_pool(
                "engines", {"spec": {"selector": {"matchLabels": {"group": "two"}}}}
            )

            async def moved() -> bool:
                engines = await through.router.client.engines()
                return [engine["url"] for engine in engines] == [cluster.engines["second"].url]

            await wait_until(moved, timeout=TIMEOUT, what="the fleet moved to the new selector")
            await wait_until(
                lambda: all_ready(through.router, 1), timeout=TIMEOUT, what="second ready"
            )
            assert [await through.served() for _ in range(3)] == ["second"] * 3


async def test_with_headcount_hung_envoy_answers_within_its_connect_timeout(
    tmp_path: Path,
) -> None:
    """A picker that never accepts (its accept queue full): the cluster's connect timeout (2 s)
    ends the wait, FailClose answers 500, the request does not hang."""
    with blackholed_listener() as port:
        config = GatewayConfig(picker_port=port)
        timeout = aiohttp.ClientTimeout(total=TIMEOUT)
        async with (
            Envoy(config, tmp_path) as envoy,
            aiohttp.ClientSession(timeout=timeout) as session,
        ):
            started = time.monotonic()
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(envoy.url + "/v1/chat/completions", json=body) as response:
                await response.read()
                assert response.status == 500
            assert time.monotonic() - started < 4.0
