"""Authentication through a whole router on loopback: client keys, the engine key, the admin port.

Each test runs the real `Router` (settings, key files, proxy, prober, admin
app, listeners) in this process before simulated engines, or before a raw
engine that records the exact bytes it receives, so what reaches an engine is
seen on the wire. Clients are raw sockets, aiohttp and the `openai` SDK, whose
`api_key` is the Bearer header.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import openai
import pytest

from headcount.config import RoutingName
from headcount.sim.engine import EngineSimConfig, running_engine
from tests.support import EngineConnection, raw_engine, wait_until
from tests.support.key_files import replace_file
from tests.support.router import CHAT, CLIENT_KEY, HOST, MODEL, TIMEOUT, Running, router_before

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

OTHER_CLIENT_KEY = "sk-client-second-77d0"
READ_TIMEOUT_S = 10.0
ENGINE_KEY = "sk-engine-41b9e2"
SECRETS = (CLIENT_KEY, OTHER_CLIENT_KEY, ENGINE_KEY)


async def routable(running: Running, count: int = 1) -> None:
    def ready() -> bool:
        return len(running.router.fleet.snapshot.routable) == count

    await wait_until(ready, what=f"{count} engine(s) routable")


def assert_unauthorized(status: int, text: str, headers: dict[str, str]) -> None:
    assert status == 401, text
    assert headers.get("WWW-Authenticate") == "Bearer"
    error = json.loads(text)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert isinstance(error["message"], str) and error["message"]
    for secret in SECRETS:
        assert secret not in text and secret not in json.dumps(headers)


# -- client keys -----------------------------------------------------------------------------

KEYED_REQUESTS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("GET", "/engines"),
    ("GET", "/metrics"),
    ("GET", "/no-such-path"),
]
BAD_CREDENTIALS: list[list[tuple[str, str]]] = [
    [],
    [("Authorization", f"Bearer {OTHER_CLIENT_KEY}")],
    [("Authorization", f"Basic {CLIENT_KEY}")],
    [("Authorization", CLIENT_KEY)],
    [("X-Api-Key", CLIENT_KEY)],
    [("Authorization", f"Bearer {CLIENT_KEY}"), ("Authorization", "Bearer x")],
]


async def test_without_the_right_key_every_api_and_admin_request_gets_401(
    tmp_path: Path,
) -> None:
    async with (
        running_engine(EngineSimConfig(model=MODEL)) as engine,
        router_before([engine.url], tmp_path) as running,
    ):
        await routable(running)
        answered = 0
        for method, path in KEYED_REQUESTS:
            for credentials in BAD_CREDENTIALS:
                query = f"?api_key={CLIENT_KEY}&key={CLIENT_KEY}"
                async with running.session.request(
                    method, running.url + path + query, json=CHAT, headers=credentials
                ) as response:
                    text = await response.text()
                    assert_unauthorized(response.status, text, dict(response.headers))
                    answered += 1
        assert running.code_count(401) == answered
        assert engine.stats()["served"] == 0


async def test_health_endpoints_need_no_key(tmp_path: Path) -> None:
    async with (
        running_engine(EngineSimConfig(model=MODEL)) as engine,
        router_before([engine.url], tmp_path) as running,
    ):
        await routable(running)
        for path in ("/livez", "/readyz", "/readyz/synced", "/livez?verbose", "/health"):
            status, text, _ = await running.get(path)
            assert status == 200, (path, text)


async def test_the_openai_sdk_with_a_key_in_clear_or_hashed_is_served(tmp_path: Path) -> None:
    import hashlib

    listed = f"{CLIENT_KEY}\nsha256:{hashlib.sha256(OTHER_CLIENT_KEY.encode()).hexdigest()}"
    async with (
        running_engine(EngineSimConfig(model=MODEL)) as engine,
        router_before([engine.url], tmp_path, client_keys=listed) as running,
    ):
        await routable(running)
        for key in (CLIENT_KEY, OTHER_CLIENT_KEY):
            sdk = running.sdk(key)
            try:
                models = await sdk.models.list()
                assert [m.id for m in models.data] == [MODEL]
                reply = await sdk.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
                )
                assert reply.choices[0].message.content
                stream = await sdk.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4,
                    stream=True,
                )
                assert len([chunk async for chunk in stream]) == 4
            finally:
                await sdk.close()
        wrong = running.sdk("sk-wrong")
        try:
            with pytest.raises(openai.AuthenticationError) as raised:
                await wrong.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}]
                )
            assert raised.value.status_code == 401 and raised.value.code == "invalid_api_key"
        finally:
            await wrong.close()


async def raw_status(port: int, parts: Sequence[bytes]) -> int:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        return int(status_line.split()[1])
    finally:
        writer.close()


async def test_a_key_split_across_reads_is_checked_whole(tmp_path: Path) -> None:
    async with (
        running_engine(EngineSimConfig(model=MODEL)) as engine,
        router_before([engine.url], tmp_path) as running,
    ):
        await routable(running)
        port = int(running.url.rsplit(":", 1)[1])
        for key, expected in ((CLIENT_KEY, 200), (CLIENT_KEY[:-1], 401), (CLIENT_KEY + "x", 401)):
            request = (
                b"GET /v1/models HTTP/1.1\r\nhost: router\r\n"
                b"authorization: Bearer %s\r\nconnection: close\r\n\r\n" % key.encode()
            )
            line_at = request.index(b"authorization")
            line_end = request.index(b"\r\n", line_at) + 2
            for cut in range(line_at, line_end + 1):
                status = await raw_status(port, (request[:cut], request[cut:]))
                assert status == expected, (key, cut)


async def test_client_keys_reload_when_the_file_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with (
        running_engine(EngineSimConfig(model=MODEL)) as engine,
        router_before([engine.url], tmp_path) as running,
    ):
        await routable(running)
        assert await running.chat(CLIENT_KEY) == 200
        assert await running.chat(OTHER_CLIENT_KEY) == 401
        replace_file(running.keys_file, OTHER_CLIENT_KEY + "\n")

        async def rotated() -> bool:
            return await running.chat(OTHER_CLIENT_KEY) == 200

        await wait_until(rotated, what="the new key admitted")
        assert await running.chat(CLIENT_KEY) == 401
        replace_file(running.keys_file, "")  # emptied, as a file half rewritten in place
        await wait_until(lambda: "no key in the file" in caplog.text, what="the bad file reported")
        assert await running.chat(OTHER_CLIENT_KEY) == 200
    for secret in SECRETS:
        assert secret not in caplog.text


async def _status_on(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, key: str
) -> int:
    """One chat on an open keep-alive connection: the answer's status, its body read."""
    body = json.dumps(CHAT).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (HOST.encode(), port, key.encode(), len(body), body)
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_S)
    return int(lines[0].split()[1])


async def test_a_key_revoked_by_a_reload_is_refused_on_the_connection_that_used_it(
    tmp_path: Path,
) -> None:
    """The connection's note of its accepted key does not outlive the keys that accepted it."""
    async with (
        running_engine(EngineSimConfig(model=MODEL)) as engine,
        router_before([engine.url], tmp_path) as running,
    ):
        await routable(running)
        port = int(running.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            assert await _status_on(reader, writer, port, CLIENT_KEY) == 200
            assert await _status_on(reader, writer, port, CLIENT_KEY) == 200  # the note's turn
            replace_file(running.keys_file, OTHER_CLIENT_KEY + "\n")

            async def reloaded() -> bool:
                return await running.chat(OTHER_CLIENT_KEY) == 200

            await wait_until(reloaded, what="the reloaded keys in use")
            assert await _status_on(reader, writer, port, CLIENT_KEY) == 401
        finally:
            writer.close()


async def test_a_tenants_files_keys_are_served_like_the_key_files_and_reload_with_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    tenants = f'[[tenant]]\nname = "chat"\nkeys = ["{OTHER_CLIENT_KEY}"]\npriority = 5\n'
    async with (
        running_engine(EngineSimConfig(model=MODEL)) as engine,
        router_before([engine.url], tmp_path, client_keys=None, tenants=tenants) as running,
    ):
        await routable(running)
        assert running.tenants_file is not None
        assert await running.chat(OTHER_CLIENT_KEY) == 200
        assert await running.chat(CLIENT_KEY) == 401 and await running.chat(None) == 401
        replace_file(running.tenants_file, tenants.replace('"]', f'", "{CLIENT_KEY}"]'))

        async def added() -> bool:
            return await running.chat(CLIENT_KEY) == 200

        await wait_until(added, what="the tenants file's new key admitted")
        replace_file(running.tenants_file, "[default]\npriority = 1\n")
        await wait_until(
            lambda: "would be open to anyone" in caplog.text, what="the keyless file refused"
        )
        assert await running.chat(CLIENT_KEY) == 200 and await running.chat(None) == 401
    for secret in SECRETS:
        assert secret not in caplog.text


# -- the engine key --------------------------------------------------------------------------


class RecordingEngine:
    """Raw engine bytes: every request head it received, answered as a tiny vLLM would."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []

    async def script(self, conn: EngineConnection) -> None:
        while (request := await conn.read_request()) is not None:
            head, body = request
            self.requests.append(head + body)
            if head.startswith(b"GET /v1/models "):
                payload = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
            elif head.startswith(b"POST "):
                payload = json.dumps({"id": "x", "object": "chat.completion", "choices": []})
                payload = payload.encode()
            else:
                await conn.send(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                continue
            await conn.send(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
            )

    def authorizations(self, prefix: bytes) -> list[list[bytes]]:
        """The `Authorization` values of each recorded request whose head starts with `prefix`."""
        return [
            [
                line.split(b":", 1)[1].strip()
                for line in request.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
                if line.lower().startswith(b"authorization:")
            ]
            for request in self.requests
            if request.startswith(prefix)
        ]


@pytest.mark.parametrize(
    ("client_keys", "engine_key"),
    [
        pytest.param(CLIENT_KEY, ENGINE_KEY, id="client-and-engine-keys"),
        pytest.param(None, ENGINE_KEY, id="engine-key"),
        pytest.param(CLIENT_KEY, None, id="client-keys"),
    ],
)
async def test_engines_see_the_engine_key_and_never_the_client_key(
    tmp_path: Path, client_keys: str | None, engine_key: str | None
) -> None:
    recording = RecordingEngine()
    expected = [b"Bearer " + ENGINE_KEY.encode()] if engine_key else []
    async with (
        raw_engine(recording.script) as engine,
        router_before(
            [engine.url], tmp_path, client_keys=client_keys, engine_key=engine_key
        ) as running,
    ):
        await routable(running)
        for connection in ("keep-alive", "keep-alive, Authorization"):
            # A client naming `Authorization` in `Connection` must not strip the engine key.
            auth = {"Authorization": f"Bearer {CLIENT_KEY}", "Connection": connection}
            status, text, _ = await running.post("/v1/chat/completions", CHAT, auth)
            assert status == 200, text
        assert recording.authorizations(b"POST ") == [expected] * 2
        probes = recording.authorizations(b"GET /v1/models")
        assert probes and all(probe == expected for probe in probes)
        assert all(CLIENT_KEY.encode() not in request for request in recording.requests)


@pytest.mark.parametrize(
    ("client_keys", "engine_key", "expected"),
    [
        pytest.param(CLIENT_KEY, ENGINE_KEY, [ENGINE_KEY], id="client-and-engine-keys"),
        pytest.param(None, ENGINE_KEY, [ENGINE_KEY], id="engine-key"),
        pytest.param(CLIENT_KEY, None, [], id="client-keys"),
        pytest.param(None, None, [CLIENT_KEY], id="no-keys"),
    ],
)
async def test_an_engine_tokenize_call_carries_what_a_forwarded_request_carries(
    tmp_path: Path, client_keys: str | None, engine_key: str | None, expected: list[str]
) -> None:
    recording = RecordingEngine()
    async with (
        raw_engine(recording.script) as engine,
        router_before(
            [engine.url],
            tmp_path,
            client_keys=client_keys,
            engine_key=engine_key,
            routing=RoutingName.KV_AWARE,
        ) as running,
    ):
        await routable(running)
        auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
        status, text, _ = await running.post("/v1/chat/completions", CHAT, auth)
        assert status == 200, text
    sent = [b"Bearer " + key.encode() for key in expected]
    assert recording.authorizations(b"POST /tokenize ") == [sent]
    assert recording.authorizations(b"POST /v1/chat/completions ") == [sent]


async def test_a_client_authorization_passes_through_when_no_key_is_configured(
    tmp_path: Path,
) -> None:
    recording = RecordingEngine()
    async with (
        raw_engine(recording.script) as engine,
        router_before([engine.url], tmp_path, client_keys=None) as running,
    ):
        await routable(running)
        status, _, _ = await running.post(
            "/v1/chat/completions", CHAT, {"Authorization": f"Bearer {CLIENT_KEY}"}
        )
        assert status == 200
        assert recording.authorizations(b"POST ") == [[b"Bearer " + CLIENT_KEY.encode()]]


async def test_an_engine_requiring_a_key_is_probed_and_served_with_it(tmp_path: Path) -> None:
    config = EngineSimConfig(model=MODEL, api_key=ENGINE_KEY)
    async with running_engine(config) as engine:
        async with router_before([engine.url], tmp_path) as keyless:
            await wait_until(
                lambda: engine_error(keyless, "HTTP 401"), what="the engine probed without a key"
            )
            assert await keyless.chat(CLIENT_KEY) == 503
        refused = engine.stats()["unauthorized"]
        async with router_before([engine.url], tmp_path, engine_key=ENGINE_KEY) as keyed:
            await routable(keyed)
            assert await keyed.chat(CLIENT_KEY) == 200
            status, text, _ = await keyed.get("/engines", CLIENT_KEY)
            assert status == 200 and ENGINE_KEY not in text
            status, text, _ = await keyed.get("/metrics", CLIENT_KEY)
            assert status == 200 and ENGINE_KEY not in text
        assert engine.stats()["unauthorized"] == refused
        assert engine.stats()["served"] == 1


async def engine_error(running: Running, error: str) -> bool:
    status, text, _ = await running.get("/engines", CLIENT_KEY)
    engines = json.loads(text)["engines"]
    return status == 200 and error in (engines[0]["last_error"] or "")


async def test_a_rewritten_engine_key_is_used_by_probes_and_requests(tmp_path: Path) -> None:
    recording = RecordingEngine()
    new_key = "sk-engine-rotated-5c1d"
    async with (
        raw_engine(recording.script) as engine,
        router_before([engine.url], tmp_path, engine_key=ENGINE_KEY) as running,
    ):
        await routable(running)
        replace_file(running.engine_key_file, f"  {new_key}\n")
        rotated = [b"Bearer " + new_key.encode()]
        await wait_until(
            lambda: recording.authorizations(b"GET /v1/models")[-1] == rotated,
            what="a probe with the new key",
        )
        assert await running.chat(CLIENT_KEY) == 200
        assert recording.authorizations(b"POST ")[-1] == rotated


async def test_the_simulated_engine_requires_its_key_on_v1_only_as_vllm_does() -> None:
    async with (
        running_engine(EngineSimConfig(model=MODEL, api_key=ENGINE_KEY)) as engine,
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        good = {"Authorization": f"Bearer {ENGINE_KEY}"}
        for headers in (
            {},
            {"Authorization": f"Bearer {CLIENT_KEY}"},
            {"Authorization": ENGINE_KEY},
        ):
            async with session.get(engine.url + "/v1/models", headers=headers) as response:
                assert response.status == 401
                assert await response.json() == {"error": "Unauthorized"}
            async with session.post(
                engine.url + "/v1/chat/completions", json=CHAT, headers=headers
            ) as response:
                assert response.status == 401
        async with session.get(engine.url + "/v1/models", headers=good) as response:
            assert response.status == 200
        async with session.post(
            engine.url + "/v1/chat/completions", json=CHAT, headers=good
        ) as response:
            assert response.status == 200
        for path in ("/health", "/metrics", "/sim/stats"):
            async with session.get(engine.url + path) as response:
                assert response.status == 200, path
        assert engine.stats()["unauthorized"] == 6 and engine.stats()["served"] == 1


# -- the body budget -------------------------------------------------------------------------

HUGE = 32 * 1024 * 1024
"""The largest body a client may declare: 16 of them are the whole default body budget."""


async def taken_in_heads(
    running: Running, *, admin: bool, count: int = 16
) -> tuple[list[bytes], list[asyncio.StreamWriter]]:
    """Open `count` connections that each send a request head declaring a `HUGE` body and
    never send it; once the router has taken in every head (answered `100 Continue`, or
    refused it), the first line each got back, and the connections."""
    url = running.admin_url if admin else running.url
    port = int(url.rpartition(":")[2])
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n" % HUGE
    )
    lines, writers = [], []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(HOST, port)
        writers.append(writer)
        writer.write(head)
        lines.append(await asyncio.wait_for(reader.readline(), 10))
    return lines, writers


@pytest.mark.parametrize(
    ("keys", "admin", "answered"),
    [
        pytest.param(CLIENT_KEY, False, b"HTTP/1.1 401", id="keyless-heads-on-the-data-port"),
        pytest.param(CLIENT_KEY, True, b"HTTP/1.1 404", id="heads-on-the-admin-port"),
        pytest.param(None, False, b"HTTP/1.1 100", id="heads-without-keys-configured"),
    ],
)
async def test_heads_declaring_huge_bodies_never_sent_do_not_refuse_a_keyed_chat(
    tmp_path: Path, keys: str | None, admin: bool, answered: bytes
) -> None:
    """Heads alone (with no key, on the admin port, or with no keys configured) hold none of
    the body budget: a keyed chat after 16 of them is served, not 503 `overloaded`."""
    async with (
        running_engine(EngineSimConfig(model=MODEL)) as engine,
        router_before([engine.url], tmp_path, client_keys=keys, admin=admin) as running,
    ):
        await routable(running)
        lines, writers = await taken_in_heads(running, admin=admin)
        try:
            assert await running.chat(CLIENT_KEY) == 200
            assert all(line.startswith(answered) for line in lines), lines
            assert running.router.proxy.connections.bodies.held == 0
        finally:
            for writer in writers:
                writer.close()


# -- the admin port --------------------------------------------------------------------------

ADMIN_PATHS = ("/engines", "/metrics", "/livez", "/readyz", "/readyz/synced", "/health")


async def test_the_admin_port_serves_admin_endpoints_and_the_api_port_only_the_api(
    tmp_path: Path,
) -> None:
    async with (
        running_engine(EngineSimConfig(model=MODEL, api_key=ENGINE_KEY)) as engine,
        router_before([engine.url], tmp_path, engine_key=ENGINE_KEY, admin=True) as running,
    ):
        await routable(running)
        for path in ADMIN_PATHS:
            status, text, _ = await running.get(path, admin=True)
            assert status == 200, (path, text)
            assert all(secret not in text for secret in SECRETS)
            status, text, _ = await running.get(path, CLIENT_KEY)
            assert status == 404, (path, text)
            admin_port = running.admin_url.rsplit(":", 1)[1]
            assert f"the admin endpoints are on --admin-port {admin_port}" in text, text
        status, text, _ = await running.get("/v1/models", admin=True)
        assert status == 404
        async with running.session.post(
            running.admin_url + "/v1/chat/completions", json=CHAT
        ) as response:
            assert response.status == 404
        status, text, headers = await running.get("/v1/models")
        assert_unauthorized(status, text, headers)
        status, text, _ = await running.get("/v1/models", CLIENT_KEY)
        assert status == 200 and MODEL in text
        assert await running.chat(CLIENT_KEY) == 200
        assert engine.stats()["served"] == 1
        host, port = running.admin_url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        assert head.startswith(b"HTTP/1.1 400 ") and b"\r\nx-request-id: " in head, head


async def test_the_admin_port_answers_through_the_drain(tmp_path: Path) -> None:
    config = EngineSimConfig(model=MODEL, token_delay=0.05)
    async with (
        running_engine(config) as engine,
        router_before([engine.url], tmp_path, admin=True, drain_timeout=20) as running,
    ):
        await routable(running)
        body = {**CHAT, "max_tokens": 400, "stream": True}
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        async with running.session.post(
            running.url + "/v1/chat/completions", json=body, headers=headers
        ) as stream:
            assert stream.status == 200
            await stream.content.readline()
            running.stop.set()

            async def data_port_closed() -> bool:
                try:
                    await running.get("/v1/models", CLIENT_KEY)
                except aiohttp.ClientConnectionError:
                    return True
                return False

            await wait_until(data_port_closed, what="the data port closed by the drain")
            status, _, _ = await running.get("/readyz", admin=True)
            assert status == 503
            status, _, _ = await running.get("/livez", admin=True)
            assert status == 200
