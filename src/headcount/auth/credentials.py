"""The keys in force, as the data plane and the prober read them, kept current from key files.

`Authentication(settings.auth)` loads the files the settings name and keeps
one `Credentials` object current: the key files replace what it holds, and the
proxy and the prober read it on each request and probe. A router without key
files has credentials that admit everyone and send engines nothing, exactly
as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from headcount.auth.keyfile import KeyFile
from headcount.auth.keys import ApiKeys, EngineKey, parse_api_keys, parse_engine_key
from headcount.config import AuthSettings

__all__ = ["Authentication", "Credentials"]

_log = logging.getLogger(__name__)


class Credentials:
    """The keys in force now; read on every request, replaced only by a reload."""

    __slots__ = ("client_keys", "forward_authorization", "probe_headers")

    def __init__(self, *, client_keys: bool = False, engine_key: bool = False) -> None:
        """Say which keys are configured; until they are loaded, no client is admitted."""
        self.client_keys: ApiKeys | None = ApiKeys() if client_keys else None
        """None: no key needed. Otherwise the keys admitted to the data plane."""
        self.forward_authorization: bytes | None = b"" if client_keys or engine_key else None
        """What replaces the client's `Authorization` on forwarded requests: the engine key's
        header line, or nothing (b"") when the client's is the router's key, which no engine
        may see. None, with no key configured: the client's passes through, as before."""
        self.probe_headers: Mapping[str, str] | None = None
        """The engine key as the prober's HTTP client takes it, or None."""

    def use_client_keys(self, keys: ApiKeys) -> None:
        self.client_keys = keys

    def use_engine_key(self, key: EngineKey) -> None:
        self.forward_authorization = key.header_line
        self.probe_headers = key.probe_headers

    def engine_probe_headers(self) -> Mapping[str, str] | None:
        """For the prober: read at each probe, so a reloaded key is used at once."""
        return self.probe_headers


class Authentication:
    """The configured key files, loaded and watched, and the `credentials` they keep current."""

    def __init__(self, settings: AuthSettings) -> None:
        self.credentials = Credentials(
            client_keys=settings.api_keys_file is not None,
            engine_key=settings.engine_api_key_file is not None,
        )
        interval = settings.key_file_check_interval
        self.files: list[KeyFile[ApiKeys] | KeyFile[EngineKey]] = []
        if settings.api_keys_file is not None:
            self.files.append(
                KeyFile(
                    settings.api_keys_file,
                    "--api-keys-file",
                    parse_api_keys,
                    self.credentials.use_client_keys,
                    check_interval=interval,
                )
            )
        if settings.engine_api_key_file is not None:
            self.files.append(
                KeyFile(
                    settings.engine_api_key_file,
                    "--engine-api-key-file",
                    parse_engine_key,
                    self.credentials.use_engine_key,
                    check_interval=interval,
                )
            )

    async def load(self) -> None:
        """The first read of every file; `ConfigError` names the flag of one that is unusable."""
        for key_file in self.files:
            await key_file.load()

    async def run(self) -> None:
        """Keep every file's keys current until cancelled."""
        if self.files:
            await asyncio.gather(*(key_file.run() for key_file in self.files))

    def reload_soon(self) -> None:
        """Read every file again now (SIGHUP); said once while a reload is still pending."""
        asked = [key_file.reload_soon() for key_file in self.files]
        if any(asked):
            _log.info("reloading %d key file(s)", len(self.files))
