"""The API server emulator seen from a client that does not reuse connections."""

from __future__ import annotations

import aiohttp

__all__ = ["refused"]


async def refused(url: str) -> bool:
    """Whether a fresh connection to the emulator at `url` is refused."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as fresh:
        try:
            async with fresh.get(f"{url}/version", timeout=aiohttp.ClientTimeout(total=1)):
                return False
        except aiohttp.ClientConnectorError:
            return True
