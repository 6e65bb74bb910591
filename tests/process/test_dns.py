"""One resolver policy for probes and proxy: never cached, and a failed lookup blames no engine.

The resolver is given a table instead of the system's DNS, so a name can move
from one loopback address to another (a Service deleted and recreated with a
new ClusterIP) or stop resolving (a cluster-DNS outage) when the test says.
The engines behind the names are simulated engines on 127.0.0.2 and 127.0.0.3,
on one port, as two ClusterIPs would be.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import pytest

from headcount._http.errors import LocalResourceExhausted, LookupFailed
from headcount._http.local import LocalRequest, LocalResponse
from headcount._http.resolve import Resolver, pinned_first
from headcount.config import OutlierSettings, ProbeSettings, ProxySettings
from headcount.fleet import EngineSpec, EngineState, Fleet, ProbeResult
from headcount.probe.prober import Prober
from headcount.proxy import Proxy, start_server
from headcount.routing import RoundRobin
from headcount.sim.engine import EngineSimConfig, running_engine
from headcount.sim.loopback import free_port_on_all
from headcount.surfaces.metrics import Metrics
from tests.support import EngineConnection, raw_engine, wait_until

__all__: list[str] = []

MODEL = "sim-model"
OLD, NEW = "127.0.0.2", "127.0.0.3"
PROBES = ProbeSettings(interval=0.05, timeout=1.0, unhealthy_after=3)
"""Three failures in a row to leave rotation: a probe caught by the switch may fail once or
twice; one that keeps dialling the old address fails every time."""


class Table:
    """A DNS stand-in: name -> addresses, changed by the test; counts lookups per name."""

    def __init__(self, **names: list[str]) -> None:
        self.names = {name.replace("_", "."): addresses for name, addresses in names.items()}
        self.lookups: dict[str, int] = {}
        self.error: OSError | None = None

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups[host] = self.lookups.get(host, 0) + 1
        if self.error is not None:
            raise self.error
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.names[host]


async def no_local_answers(request: LocalRequest) -> LocalResponse:
    return LocalResponse(404)


async def one_answer_per_connection(conn: EngineConnection) -> None:
    """An engine that closes every connection after one answer: each request and each probe
    needs a new connection, hence a lookup, as after a pooled connection went stale."""
    request = await conn.read_request()
    if request is None:
        return
    if request[0].startswith(b"GET /v1/models"):
        body = b'{"object": "list", "data": [{"id": "%s", "object": "model"}]}' % MODEL.encode()
    else:
        body = b"{}"
    await conn.send(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-engine-name: closing\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )


# -- the resolver -----------------------------------------------------------------------------


async def test_a_literal_address_is_never_looked_up() -> None:
    table = Table()
    assert await Resolver(0.5, table).resolve("127.0.0.9", 80) == ("127.0.0.9",)
    assert await Resolver(0.5, table).resolve("::1", 80) == ("::1",)
    assert table.lookups == {}


async def test_pinned_names_are_answered_without_a_lookup_and_others_are_looked_up() -> None:
    table = Table(svc_test=[OLD])
    resolver = Resolver(0.5, pinned_first({"vllm.llm": "127.0.0.21"}, table))
    assert await resolver.resolve("vllm.llm", 80) == ("127.0.0.21",)
    assert await resolver.resolve("VLLM.llm.", 80) == ("127.0.0.21",)
    assert await resolver.resolve("svc.test", 80) == [OLD]
    assert table.lookups == {"svc.test": 1}
    assert pinned_first({}, table) is table


async def test_every_call_looks_the_name_up_again() -> None:
    table = Table(svc_test=[OLD])
    resolver = Resolver(0.5, table)
    assert await resolver.resolve("svc.test", 80) == [OLD]
    table.names["svc.test"] = [NEW, OLD]
    assert await resolver.resolve("svc.test", 80) == [NEW, OLD]
    assert table.lookups == {"svc.test": 2}


async def test_lookup_failures_are_lookup_failed_and_exhaustion_is_the_routers() -> None:
    table = Table(empty_test=[])
    resolver = Resolver(0.05, table)
    with pytest.raises(LookupFailed, match=r"gone\.test: Name or service not known"):
        await resolver.resolve("gone.test", 80)
    with pytest.raises(LookupFailed, match="no address"):
        await resolver.resolve("empty.test", 80)

    async def never(host: str, port: int) -> Sequence[str]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    with pytest.raises(LookupFailed, match=r"no answer within 0\.05s"):
        await Resolver(0.05, never).resolve("slow.test", 80)
    table.error = OSError(errno.EMFILE, "Too many open files")
    with pytest.raises(LocalResourceExhausted) as raised:
        await resolver.resolve("any.test", 80)
    assert raised.value.resource == "fds"


# -- probes and proxy together ----------------------------------------------------------------


@dataclass
class Router:
    fleet: Fleet
    proxy: Proxy
    url: str
    session: aiohttp.ClientSession
    table: Table
    left: list[str] = field(default_factory=list)

    async def chat(self) -> tuple[int, str]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        async with self.session.post(self.url + "/v1/chat/completions", json=body) as response:
            await response.read()
            return response.status, response.headers.get("x-engine-name", "")

    def engine(self, engine_id: str) -> tuple[EngineState, str | None, tuple[str, ...]]:
        engine = self.fleet.snapshot.by_id[engine_id]
        return engine.state, engine.last_error, engine.adapters


@asynccontextmanager
async def router(table: Table, urls: Sequence[str]) -> AsyncIterator[Router]:
    """A proxy and a prober sharing one resolver over `table`, for engines at `urls`."""
    resolver = Resolver(0.5, table)
    fleet = Fleet(unhealthy_after=PROBES.unhealthy_after, outliers=OutlierSettings())
    fleet.reconcile("static", [EngineSpec(id=u, name=u, url=u, source="static") for u in urls])
    proxy = Proxy(
        fleet,
        RoundRobin(),
        ProxySettings(connect_timeout=1.0, read_timeout=5.0),
        Metrics(lambda: fleet.snapshot),
        no_local_answers,
        resolver=resolver,
    )
    server = await start_server(proxy, "127.0.0.1", 0)
    prober = asyncio.create_task(Prober(fleet, PROBES, resolver=resolver).run())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        setup = Router(
            fleet, proxy, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", session, table
        )
        fleet.subscribe(lambda change: setup.left.extend(change.left))
        try:
            yield setup
        finally:
            prober.cancel()
            await asyncio.gather(prober, return_exceptions=True)
            await proxy.close()


async def test_a_recreated_service_is_followed_by_the_proxy_and_the_probes_at_once() -> None:
    port = free_port_on_all([OLD, NEW])
    url = f"http://svc.test:{port}"
    table = Table(svc_test=[OLD])
    async with AsyncExitStack() as stack:
        old, new = [
            await stack.enter_async_context(running_engine(config))
            for config in (
                EngineSimConfig(host=OLD, port=port, name="old"),
                EngineSimConfig(host=NEW, port=port, name="new", adapters=("on-new",)),
            )
        ]
        setup = await stack.enter_async_context(router(table, [url]))
        await wait_until(lambda: setup.engine(url)[0] is EngineState.READY, what="ready")
        assert await setup.chat() == (200, "old")

        table.names["svc.test"] = [NEW]  # the Service is recreated with a new ClusterIP...
        await old.stop()  # ...and the old one is gone

        assert await setup.chat() == (200, "new"), "the proxy dials the new address"
        await wait_until(
            lambda: setup.engine(url) == (EngineState.READY, None, ("on-new",)),
            what="a probe answered by the new address",
        )
        assert setup.left == [], "the engine never left rotation"
        assert await setup.chat() == (200, "new")
        del new


async def test_a_name_that_stops_resolving_fails_over_and_blames_no_engine() -> None:
    async with (
        running_engine(EngineSimConfig(name="good")) as good,
        raw_engine(one_answer_per_connection) as closing,
    ):
        gone = f"http://gone.test:{closing.port}"
        table = Table(gone_test=["127.0.0.1"])
        async with router(table, [gone, good.url]) as setup:
            await wait_until(
                lambda: all(e.routable for e in setup.fleet.snapshot.engines), what="ready"
            )
            del table.names["gone.test"]  # a cluster-DNS outage for this name
            before = table.lookups["gone.test"]
            answers = [await setup.chat() for _ in range(6)]
            assert answers == [(200, "good")] * 6, "the unresolvable engine is failed over"
            await wait_until(
                lambda: table.lookups["gone.test"] >= before + 3 + 3 * PROBES.unhealthy_after,
                what="several probes that could not resolve",
            )
            state, error, _ = setup.engine(gone)
            assert state is EngineState.READY and (error or "").startswith("dns: gone.test")
            engine = setup.fleet.snapshot.by_id[gone]
            assert (engine.load.failures, engine.load.consecutive_errors) == (0, 0)
            assert setup.left == [] and setup.fleet.snapshot.ejected == frozenset()


async def test_a_probe_the_router_cannot_make_for_want_of_fds_changes_no_state() -> None:
    async with raw_engine(one_answer_per_connection) as engine:
        url = f"http://engine.test:{engine.port}"
        table = Table(engine_test=["127.0.0.1"])
        async with router(table, [url]) as setup:
            await wait_until(lambda: setup.engine(url)[0] is EngineState.READY, what="ready")
            table.error = OSError(errno.EMFILE, "Too many open files")
            before = table.lookups["engine.test"]
            await wait_until(
                lambda: table.lookups["engine.test"] >= before + 2 * PROBES.unhealthy_after,
                what="probes that found no fd",
            )
            state, error, _ = setup.engine(url)
            assert state is EngineState.READY, error
            assert "out of fds" in (error or ""), error
            assert setup.left == []
            setup.fleet.apply_probe(url, ProbeResult(ok=False, error="a real failure"))
            assert setup.fleet.snapshot.by_id[url].probe_failures == 1
