"""A key file that reloads without a restart: on demand (SIGHUP) or when it changes on disk.

    keys = KeyFile(path, "--api-keys-file", parse_api_keys, on_keys, check_interval=5.0)
    await keys.load()          # the first read: a bad file is a ConfigError naming the flag
    task = create_task(keys.run())
    keys.reload_soon()         # SIGHUP: read again even if nothing seems to have changed

Every read happens in a worker thread (`asyncio.to_thread`), never on the event
loop. `run` looks at the file's identity (device, inode, size, mtime) every
`check_interval` seconds and reads it only when that changed; a Kubernetes
Secret volume swaps a symlink, so an update there is a new inode. A file that
cannot be read or parsed leaves the keys in force unchanged, and the error is
logged once, not every interval; the messages never quote the file's content.
A read whose content is the one in force (SIGHUP on an unchanged file) changes
nothing and logs only at debug level, so a storm of signals is not a storm of lines.
Write a new file and rename it over the old one: a reader may see a file being
rewritten in place half-written.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Generic, TypeVar

from headcount.auth.keys import KeyFileError
from headcount.config import ConfigError

__all__ = ["KeyFile"]

_log = logging.getLogger(__name__)

T = TypeVar("T")
_Identity = tuple[int, int, int, int]
_Read = tuple[_Identity, bytes, "T | KeyFileError"]
"""A file's identity, the digest of its content, and its parsed value (or why it has none)."""


def _identity(stat: os.stat_result) -> _Identity:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


class KeyFile(Generic[T]):
    """One key file: `parse` turns its text into a value, `apply` puts the value in force."""

    def __init__(
        self,
        path: Path,
        flag: str,
        parse: Callable[[str], T],
        apply: Callable[[T], None],
        *,
        check_interval: float,
    ) -> None:
        self.path = path
        self.flag = flag
        self._parse = parse
        self._apply = apply
        self._check_interval = check_interval
        self._seen: _Identity | None = None
        self._in_force: bytes | None = None
        """The digest of the content whose keys are in force."""
        self._last_error: str | None = None
        self._wake = asyncio.Event()

    async def load(self) -> None:
        """Read the file and put its keys in force; `ConfigError` if it cannot be used."""
        try:
            read = await asyncio.to_thread(self._read, None)
        except OSError as exc:
            raise ConfigError(f"{self.flag} {self.path}: {_describe(exc)}") from None
        assert read is not None
        identity, digest, value = read
        self._seen = identity
        if isinstance(value, KeyFileError):
            raise ConfigError(f"{self.flag} {self.path}: {value}")
        self._apply(value)
        self._in_force = digest
        _log.info("%s %s loaded", self.flag, self.path)

    def reload_soon(self) -> bool:
        """Read the file again at once, changed or not (what SIGHUP asks); False when a
        reload was asked for already and has not begun."""
        asked = not self._wake.is_set()
        self._wake.set()
        return asked

    async def run(self) -> None:
        """Reload whenever asked or the file changes, until cancelled."""
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._check_interval)
            forced = self._wake.is_set()
            self._wake.clear()
            await self.check(forced=forced)

    async def check(self, *, forced: bool = False) -> bool:
        """Reload if the file changed (or `forced`); whether new keys are in force now.

        A file that fails to parse counts as seen: it is not read, nor reported,
        again until it changes. An unreadable file is reported when the reason changes.
        """
        try:
            read = await asyncio.to_thread(self._read, None if forced else self._seen)
        except OSError as exc:
            error = _describe(exc)
            if forced or error != self._last_error:
                self._report(error)
            self._last_error = error
            return False
        if read is None:
            return False
        identity, digest, value = read
        self._seen = identity
        if isinstance(value, KeyFileError):
            self._last_error = str(value)
            self._report(str(value))
            return False
        self._last_error = None
        if digest == self._in_force:
            _log.debug("%s %s read again, unchanged", self.flag, self.path)
            return False
        self._apply(value)
        self._in_force = digest
        _log.info("%s %s reloaded", self.flag, self.path)
        return True

    def _report(self, error: str) -> None:
        _log.error("%s %s: %s; the keys in force stay", self.flag, self.path, error)

    def _read(self, seen: _Identity | None) -> _Read[T] | None:
        """In a worker thread: the file's identity, content digest and parsed value (or why
        it has none); None if the identity is `seen`. The identity is taken before the read,
        so a change during the read is seen as a change at the next check."""
        identity = _identity(os.stat(self.path))
        if identity == seen:
            return None
        with open(self.path, "rb") as file:
            data = file.read()
        digest = hashlib.sha256(data).digest()
        try:
            return identity, digest, self._parse(data.decode("utf-8"))
        except UnicodeDecodeError:
            return identity, digest, KeyFileError("not UTF-8 text")
        except KeyFileError as exc:
            return identity, digest, exc


def _describe(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__
