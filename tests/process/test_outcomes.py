"""Outcomes named truthfully: the status the client saw, how the answer ended, and route errors.

A whole router (`tests.support.router.router_before`, no client keys) answers
an unknown path with the router's OpenAI error shape and an `x-request-id`, and
a wrong method on a known path with 405 and `Allow`. Through the proxy of
`tests.support.routed.routed`, `headcount_requests_total` records a stream cut
after its 200 as `200`/`cut`, an engine's whole 5xx as `error`, and `/engines`
counts the 5xx answers of an engine with no other to fail over to.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from headcount.config import OutlierSettings
from headcount.surfaces.metrics import OUTCOMES
from tests.support.routed import CHAT, MODEL, chat, routed, sim
from tests.support.router import router_before

__all__: list[str] = []

pytestmark = pytest.mark.timeout(60)

NO_ENGINE = "http://127.0.0.1:9"
"""A backend nobody serves: routes are answered without any engine."""


def assert_router_error(document: dict[str, object], code: str) -> None:
    error = document["error"]
    assert isinstance(error, dict)
    assert error["code"] == code and isinstance(error["message"], str)
    assert error["type"] == "invalid_request_error"


async def test_an_unknown_path_is_an_openai_404_with_a_request_id(tmp_path: Path) -> None:
    async with router_before([NO_ENGINE], tmp_path, client_keys=None) as running:
        async with running.session.get(running.url + "/v1/nowhere") as response:
            assert response.status == 404
            assert response.headers["x-request-id"]
            assert_router_error(await response.json(), "not_found")
        headers = {"x-request-id": "req-from-client"}
        async with running.session.get(running.url + "/nowhere", headers=headers) as response:
            assert response.status == 404
            assert response.headers["x-request-id"] == "req-from-client"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("GET", "/v1/embeddings", "POST"),
        ("PUT", "/v1/completions", "POST"),
        ("POST", "/v1/models", "GET, HEAD"),
        ("POST", "/health", "GET, HEAD"),
    ],
)
async def test_a_wrong_method_on_a_known_path_is_405_with_allow(
    tmp_path: Path, method: str, path: str, allow: str
) -> None:
    async with router_before([NO_ENGINE], tmp_path, client_keys=None) as running:
        async with running.session.request(method, running.url + path) as response:
            assert response.status == 405
            assert response.headers["allow"] == allow
            assert response.headers["x-request-id"]
            document = await response.json()
        assert_router_error(document, "method_not_allowed")
        assert f"{method} not allowed on {path}" in str(document)


async def test_a_stream_cut_after_its_200_counts_as_200_cut() -> None:
    configs = (sim("a", fail_mode="die-mid-stream"),)
    async with routed(*configs) as setup:
        async with setup.session.post(setup.url + CHAT, json=chat(stream=True)) as response:
            assert response.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()

        def counted(code: str, outcome: str) -> float:
            return setup.sample("headcount_requests_total", model=MODEL, code=code, outcome=outcome)

        assert counted("200", "cut") == 1
        assert sum(counted(code, outcome) for code in ("200", "502") for outcome in OUTCOMES) == 1


async def test_an_engines_whole_5xx_counts_as_error() -> None:
    async with routed(sim("a", fail_mode="http-500")) as setup:
        status, _, _ = await setup.post(CHAT, chat())
        assert status == 500
        assert setup.sample("headcount_requests_total", model=MODEL, code="500", outcome="error")


async def test_an_engine_ejected_for_its_5xx_answers_counts_them_as_failures() -> None:
    """What `/engines` shows as `failures`: one engine, so no answer can be failed over."""
    async with routed(sim("a", fail_mode="http-500"), outliers=OutlierSettings()) as setup:
        for _ in range(5):
            status, _, _ = await setup.post(CHAT, chat())
            assert status == 500
        (engine,) = setup.fleet.snapshot.engines
    assert engine.ejection.count == 1
    assert setup.loads() == [(0, 5, 5)]
