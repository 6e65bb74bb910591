"""The API server emulator seen from a client: pods as kubectl creates them, a refusal."""

from __future__ import annotations

import aiohttp

__all__ = ["bare_pod", "refused"]


def bare_pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, object]:
    """A pod as kubectl creates it: a spec, no status."""
    return {
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "engine", "image": "sim"}]},
    }


async def refused(url: str) -> bool:
    """Whether a fresh connection to the emulator at `url` is refused."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as fresh:
        try:
            async with fresh.get(f"{url}/version", timeout=aiohttp.ClientTimeout(total=1)):
                return False
        except aiohttp.ClientConnectorError:
            return True
