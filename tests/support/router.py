"""A whole `Router` in this process before given backends, as the auth tests run it.

`router_before` writes the key files (and a tenants file if given), starts the
real `Router` (settings, key files, proxy, prober, admin app, listeners) on
free loopback ports and waits until it answers `/livez`; `Running` is what a
test holds: the router, its URLs, its key files and a client session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import openai

from headcount.app import Router, build_kv_wiring, build_sources
from headcount.config import (
    AuthSettings,
    DiscoverySettings,
    FlowSettings,
    HealthSettings,
    ProbeSettings,
    ProxySettings,
    RoutingName,
    ServerSettings,
    Settings,
)
from headcount.fleet import Fleet
from headcount.sim.cluster.polling import wait_until
from headcount.sim.loopback import free_port

__all__ = ["CHAT", "CLIENT_KEY", "HOST", "MODEL", "TIMEOUT", "Running", "router_before"]

MODEL = "sim-model"
HOST = "127.0.0.1"
CLIENT_KEY = "sk-client-8f3a1c"
"""The client key `router_before` writes to the key file unless told otherwise."""
TIMEOUT = aiohttp.ClientTimeout(total=10)
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@dataclass
class Running:
    router: Router
    url: str
    admin_url: str
    keys_file: Path
    engine_key_file: Path
    session: aiohttp.ClientSession
    tenants_file: Path | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def get(
        self, path: str, key: str | None = None, *, admin: bool = False
    ) -> tuple[int, str, dict[str, str]]:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        url = (self.admin_url if admin else self.url) + path
        async with self.session.get(url, headers=headers) as response:
            return response.status, await response.text(), dict(response.headers)

    async def post(
        self, path: str, body: object, headers: dict[str, str] | None = None
    ) -> tuple[int, str, dict[str, str]]:
        async with self.session.post(self.url + path, json=body, headers=headers) as response:
            return response.status, await response.text(), dict(response.headers)

    async def chat(self, key: str | None) -> int:
        headers = None if key is None else {"Authorization": f"Bearer {key}"}
        status, _, _ = await self.post("/v1/chat/completions", CHAT, headers)
        return status

    def sdk(self, key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=10)

    def code_count(self, code: int) -> float:
        labels = {"model": "unknown", "code": str(code), "outcome": "ok"}
        return self.router.metrics.sample("headcount_requests_total", labels) or 0.0


@asynccontextmanager
async def router_before(
    backends: Sequence[str],
    tmp_path: Path,
    *,
    client_keys: str | None = CLIENT_KEY,
    engine_key: str | None = None,
    admin: bool = False,
    drain_timeout: float = 5.0,
    routing: RoutingName = RoutingName.ROUND_ROBIN,
    tenants: str | None = None,
    flow: FlowSettings | None = None,
    probe_interval: float = 0.1,
    access_log_sample: float = ProxySettings.access_log_sample,
) -> AsyncIterator[Running]:
    """`tenants`: the text of a tenants file, None for none; `flow`: flow control's settings."""
    keys_file, engine_key_file = tmp_path / "client-keys", tmp_path / "engine-key"
    tenants_file = None if tenants is None else tmp_path / "tenants.toml"
    if tenants_file is not None and tenants is not None:
        tenants_file.write_text(tenants)
    if client_keys is not None:
        keys_file.write_text(client_keys + "\n")
    if engine_key is not None:
        engine_key_file.write_text(engine_key + "\n")
    port, admin_port = free_port(HOST), free_port(HOST)
    settings = Settings(
        server=ServerSettings(host=HOST, port=port, admin_port=admin_port if admin else None),
        discovery=DiscoverySettings(backends=tuple(backends)),
        proxy=ProxySettings(routing=routing, access_log_sample=access_log_sample),
        probe=ProbeSettings(interval=probe_interval, timeout=2.0),
        health=HealthSettings(drain_delay=0.0, drain_timeout=drain_timeout),
        auth=AuthSettings(
            api_keys_file=keys_file if client_keys is not None else None,
            engine_api_key_file=engine_key_file if engine_key is not None else None,
            tenants_file=tenants_file,
            key_file_check_interval=0.05,
        ),
        flow=flow or FlowSettings(),
    )
    fleet = Fleet(unhealthy_after=1)
    kv = None
    if routing is RoutingName.KV_AWARE:
        kv = await build_kv_wiring(settings.kv_events, fleet)
    router = Router(settings, fleet, await build_sources(settings, fleet), kv)
    url = f"http://{HOST}:{port}"
    admin_url = f"http://{HOST}:{admin_port}" if admin else url
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        running = Running(router, url, admin_url, keys_file, engine_key_file, session, tenants_file)
        task = asyncio.create_task(router.run(running.stop))

        async def listening() -> bool:
            if task.done():
                task.result()
            try:
                status, _, _ = await running.get("/livez", admin=True)
            except aiohttp.ClientConnectionError:
                return False
            return status == 200

        try:
            await wait_until(listening, what="the router listening")
            yield running
        finally:
            running.stop.set()
            await asyncio.wait_for(task, 20)
