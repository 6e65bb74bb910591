"""A router seen from outside: its own endpoints and one chat request, over real HTTP.

Every call opens its own connection, as a probe or a scraper would, so what a
caller sees never depends on a connection kept from an earlier call.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

__all__ = ["RouterClient"]


class RouterClient:
    """`RouterClient("http://127.0.0.1:8080")`: GETs `/engines`, `/health`, `/metrics`, ...

    Each request is bounded by `timeout` seconds, connect and answer together.
    """

    def __init__(self, url: str, *, timeout: float = 3.0) -> None:
        self.url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    @contextlib.asynccontextmanager
    async def _get(self, path: str) -> AsyncIterator[aiohttp.ClientResponse]:
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            async with session.get(self.url + path) as response:
                yield response

    async def get(self, path: str) -> tuple[int, str]:
        """Status and text of `GET path`, e.g. `/livez?verbose`."""
        async with self._get(path) as response:
            return response.status, await response.text()

    async def status_of(self, path: str) -> int:
        status, _ = await self.get(path)
        return status

    async def get_json(self, path: str) -> Any:
        async with self._get(path) as response:
            return await response.json(content_type=None)

    async def engines(self) -> list[dict[str, Any]]:
        """`/engines`: one object per engine the router knows, in its order."""
        body = await self.get_json("/engines")
        engines: list[dict[str, Any]] = body["engines"]
        return engines

    async def engines_by_name(self) -> dict[str, dict[str, Any]]:
        """`/engines` keyed by object name without its namespace (`llm/p1` is `p1`)."""
        return {engine["name"].split("/", 1)[1]: engine for engine in await self.engines()}

    async def health(self) -> dict[str, Any]:
        """The `/health` document, whatever its status code."""
        body: dict[str, Any] = await self.get_json("/health")
        return body

    async def metrics(self) -> str:
        """The `/metrics` exposition; an error status raises `aiohttp.ClientResponseError`."""
        async with self._get("/metrics") as response:
            response.raise_for_status()
            return await response.text()

    async def metric_value(self, name: str, label: str = "") -> float:
        """The sum of the samples of metric `name` whose labels include `label` (`k="v"`;
        empty: every label set)."""
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in (await self.metrics()).splitlines()
            if line.startswith(name)
            and line[len(name) : len(name) + 1] in ("{", " ")
            and label in line.rsplit(" ", 1)[0]
        )

    async def chat(self, model: str, *, max_tokens: int = 2) -> tuple[int, dict[str, Any]]:
        """One non-streaming chat completion through the router: status and JSON body."""
        messages = [{"role": "user", "content": "hi"}]
        body = {"model": model, "messages": messages, "max_tokens": max_tokens}
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            async with session.post(self.url + "/v1/chat/completions", json=body) as response:
                return response.status, await response.json(content_type=None)

    async def routable(self, model: str) -> bool:
        """Whether a request for `model` succeeds now."""
        status, _ = await self.chat(model)
        return status == 200
