"""The keys in force, as the data plane and the prober read them, kept current from key files.

`Authentication(settings.auth)` loads the files the settings name and keeps
one `Credentials` object current: the key files replace what it holds, and the
proxy and the prober read it on each request and probe. A router without key
files has credentials that admit everyone and send engines nothing, exactly
as before.

Client keys come from `--api-keys-file` (each the `default` tenant's) and the
tenants file (each its tenant's), merged into one `client_keys` whenever
either reloads. Whether a key is required is settled at start: with
`--api-keys-file`, or when the tenants file then holds a key. A tenants file
reloaded later may not change that: one that would leave no key would open
the router to anyone, one that brings the first keys to a router started open
would have them reach engines; either is refused and the file in force stays.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from headcount.auth.digest import KeyFileError
from headcount.auth.keyfile import KeyFile
from headcount.auth.keys import ApiKeys, EngineKey, parse_api_keys, parse_engine_key
from headcount.auth.tenants import DEFAULT_TENANT, Tenant, Tenants, parse_tenants
from headcount.config import AuthSettings

__all__ = ["Authentication", "Credentials"]

_log = logging.getLogger(__name__)

_OPEN = Tenant(DEFAULT_TENANT)


class Credentials:
    """The keys in force now; read on every request, replaced only by a reload."""

    __slots__ = (
        "_default",
        "_engine_key",
        "_file_keys",
        "_keys_required",
        "client_keys",
        "forward_authorization",
        "probe_headers",
        "tenants",
    )

    def __init__(
        self, *, client_keys: bool = False, engine_key: bool = False, tenants: bool = False
    ) -> None:
        """Say which files are configured; until they are loaded, no client is admitted."""
        self._keys_required: bool | None = client_keys or (None if tenants else False)
        """Settled at start: with `--api-keys-file`, or by the tenants file's first load."""
        self._file_keys: ApiKeys | None = ApiKeys() if client_keys else None
        self._engine_key = engine_key
        self._default = _OPEN
        self.client_keys: ApiKeys | None = ApiKeys() if client_keys or tenants else None
        """None: no key needed. Otherwise the keys admitted to the data plane, each with its
        tenant."""
        self.tenants: Tenants | None = Tenants() if tenants else None
        """None: no tenants file, flow control is off."""
        self.forward_authorization: bytes | None = (
            b"" if client_keys or tenants or engine_key else None
        )
        """What replaces the client's `Authorization` on forwarded requests: the engine key's
        header line, or nothing (b"") when the client's is the router's key, which no engine
        may see. None, with no key configured: the client's passes through, as before."""
        self.probe_headers: Mapping[str, str] | None = None
        """The engine key as the prober's HTTP client takes it, or None."""

    def tenant_of(self, headers: list[tuple[bytes, bytes]]) -> Tenant:
        """The tenant of a request the data plane admitted: its key's, else (open, or a key of
        `--api-keys-file`) the default tenant. One SHA-256 with keys, none without."""
        keys = self.client_keys
        if keys is not None:
            tenant = keys.tenant(headers)
            if tenant is not None:
                return tenant
        return self._default

    def use_client_keys(self, keys: ApiKeys) -> None:
        """`--api-keys-file`'s keys."""
        self._file_keys = keys
        self._merge()

    def check_tenants(self, tenants: Tenants) -> None:
        """`KeyFileError` for a reloaded tenants file that would change whether keys are
        required (safe in a worker thread: what it reads is settled at start)."""
        required = self._keys_required
        if required is None or self._file_keys is not None or bool(tenants.by_digest) == required:
            return
        if required:
            raise KeyFileError(
                "no key in the file: the router, started with keys, would be open to anyone "
                "(to revoke every key, stop the router)"
            )
        raise KeyFileError(
            "keys in the file, but the router started without any (open): restart it to "
            "require keys"
        )

    def use_tenants(self, tenants: Tenants) -> None:
        """The tenants file's tenants; the first settles whether keys are required."""
        if self._keys_required is None:
            self._keys_required = bool(tenants.by_digest)
        self.tenants = tenants
        self._default = tenants.default
        self._merge()

    def use_engine_key(self, key: EngineKey) -> None:
        self.forward_authorization = key.header_line
        self.probe_headers = key.probe_headers

    def engine_probe_headers(self) -> Mapping[str, str] | None:
        """For the prober: read at each probe, so a reloaded key is used at once."""
        return self.probe_headers

    def _merge(self) -> None:
        if not self._keys_required:
            self.client_keys = None
            if not self._engine_key:
                self.forward_authorization = None
            return
        tenants, file_keys = self.tenants, self._file_keys
        if file_keys is None:
            self.client_keys = ApiKeys(tenants.by_digest if tenants is not None else None)
        else:
            self.client_keys = file_keys if tenants is None else file_keys.merged(tenants)


class Authentication:
    """The configured key files, loaded and watched, and the `credentials` they keep current."""

    def __init__(self, settings: AuthSettings) -> None:
        self.credentials = Credentials(
            client_keys=settings.api_keys_file is not None,
            engine_key=settings.engine_api_key_file is not None,
            tenants=settings.tenants_file is not None,
        )
        interval = settings.key_file_check_interval
        self.files: list[KeyFile[ApiKeys] | KeyFile[EngineKey] | KeyFile[Tenants]] = []
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
        if settings.tenants_file is not None:
            self.files.append(
                KeyFile(
                    settings.tenants_file,
                    "--tenants-file",
                    self._parse_tenants,
                    self.credentials.use_tenants,
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

    def _parse_tenants(self, text: str) -> Tenants:
        tenants = parse_tenants(text)
        self.credentials.check_tenants(tenants)
        return tenants

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
