"""API keys and key files on their own: what is admitted, what is kept, how a file reloads.

Pure checks (parsing, `ApiKeys.admits` over generated keys and headers) and a
`KeyFile` on real files in a temporary directory, rewritten as an operator or
Kubernetes would: renamed over, rewritten in place, broken, deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from headcount._http.handler import ConnectionNote
from headcount.auth import (
    ApiKeys,
    Authentication,
    KeyFileError,
    parse_api_keys,
    parse_engine_key,
)
from headcount.auth.keyfile import KeyFile
from headcount.cli.serve_flags import add_serve_arguments, settings_from_args
from headcount.config import AuthSettings, ConfigError, ServerSettings
from tests.support import wait_until
from tests.support.key_files import bearer, replace_file

__all__: list[str] = []

KEY_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
KEYS = st.text(KEY_CHARS, min_size=1, max_size=40).filter(
    lambda key: not key.startswith(("sha256:", "#"))
)


def digest_line(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


# -- which requests are admitted ------------------------------------------------------------


@given(
    keys=st.lists(KEYS, min_size=1, max_size=8, unique=True),
    hashed=st.lists(st.booleans(), min_size=8, max_size=8),
    candidate=KEYS,
    pick=st.integers(min_value=-1, max_value=7),
)
def test_a_key_is_admitted_exactly_when_the_file_lists_it_in_clear_or_hashed(
    keys: list[str], hashed: list[bool], candidate: str, pick: int
) -> None:
    if 0 <= pick < len(keys):
        candidate = keys[pick]
    lines = [digest_line(key) if hashed[i] else key for i, key in enumerate(keys)]
    admitted = parse_api_keys("\n".join(lines))
    assert admitted.admits(bearer(candidate)) == (candidate in keys)


@given(key=KEYS, scheme=st.sampled_from([b"Bearer ", b"bearer ", b"BEARER ", b"Bearer   "]))
def test_the_bearer_scheme_is_case_insensitive(key: str, scheme: bytes) -> None:
    assert parse_api_keys(key).admits(bearer(key, scheme))


@given(key=KEYS, other=KEYS)
def test_anything_but_one_bearer_header_is_refused(key: str, other: str) -> None:
    keys = parse_api_keys(key)
    assert not keys.admits([])
    assert not keys.admits(bearer(key, b"Basic "))
    assert not keys.admits(bearer(key, b"Bearer"))  # no space: another scheme
    assert not keys.admits(bearer(key, b""))
    assert not keys.admits([(b"x-api-key", key.encode())])
    # Two Authorization headers: which one a later hop reads is anyone's guess.
    assert not keys.admits(bearer(key) + bearer(other))


@given(key=KEYS, prefix=st.binary(max_size=6), suffix=st.binary(min_size=1, max_size=6))
def test_a_key_with_bytes_added_is_refused(key: str, prefix: bytes, suffix: bytes) -> None:
    raw = key.encode()
    assume(prefix.strip(b" \t") or suffix.strip(b" \t"))
    assert not parse_api_keys(key).admits(bearer(prefix.lstrip(b" \t") + raw + suffix))


def test_no_key_at_all_admits_nobody() -> None:
    assert not ApiKeys().admits(bearer("anything"))


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What `hashlib.sha256` is asked to hash, in order, from now on."""
    seen: list[bytes] = []
    real = hashlib.sha256

    def counting(data: bytes) -> Any:
        seen.append(data)
        return real(data)

    monkeypatch.setattr(hashlib, "sha256", counting)
    return seen


def test_the_key_is_hashed_once_and_only_its_digest_is_looked_up(hashed: list[bytes]) -> None:
    """Among many keys, each admits and a near miss does not: the digest decides, not a
    comparison of the key's text with others."""
    keys = [f"sk-key-{n}" for n in range(1000)]
    admitted = parse_api_keys("\n".join(keys))
    for key in ["sk-key-0", "sk-key-999", "sk-key-1000", "sk-key-99 "]:
        hashed.clear()
        assert admitted.admits(bearer(key)) == (key.strip() in keys)
        assert hashed == [key.strip().encode()]


def test_a_connections_key_is_hashed_once_while_the_keys_that_accepted_it_stand(
    hashed: list[bytes],
) -> None:
    admitted = parse_api_keys("sk-one\nsk-two\n")
    reloaded = parse_api_keys("sk-two\n")
    note = ConnectionNote()
    steps = [
        (admitted, "sk-one", True, [b"sk-one"]),  # checked, and noted
        (admitted, "sk-one", True, []),  # the connection's next request: not hashed again
        (admitted, "sk-bad", False, [b"sk-bad"]),  # another key is checked; refused, not noted
        (admitted, "sk-one", True, []),
        (admitted, "sk-two", True, [b"sk-two"]),  # the note follows the key last accepted
        (admitted, "sk-one", True, [b"sk-one"]),
        (reloaded, "sk-one", False, [b"sk-one"]),  # new keys: the old note is no longer used
        (reloaded, "sk-two", True, [b"sk-two"]),
        (reloaded, "sk-two", True, []),
    ]
    for keys, key, admits, hashes in steps:
        hashed.clear()
        assert keys.admits(bearer(key), note) is admits, key
        assert hashed == hashes, key


def test_only_digests_are_kept() -> None:
    keys = parse_api_keys("sk-secret-one\nsk-secret-two\n")
    assert sorted(keys._digests) == sorted(
        hashlib.sha256(k).digest() for k in (b"sk-secret-one", b"sk-secret-two")
    )
    assert "secret" not in repr(keys)


# -- the key file formats --------------------------------------------------------------------


def test_comments_blank_lines_and_crlf_are_allowed() -> None:
    text = "# team keys\r\n\r\n  sk-alice   # alice\r\n" + digest_line("sk-bob") + "\r\n#sk-old\n"
    keys = parse_api_keys(text)
    assert len(keys) == 2
    assert keys.admits(bearer("sk-alice")) and keys.admits(bearer("sk-bob"))
    assert not keys.admits(bearer("sk-old")) and not keys.admits(bearer("#sk-old"))


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("", "no key"),
        ("# only a comment\n\n", "no key"),
        ("sk-good\nsk-secret and more\n", "line 2"),
        ("sha256:abc123\n", "line 1"),
        ("sha256:" + "z" * 64 + "\n", "line 1"),
        ("sk-good\nsk-s\x01cret\n", "line 2"),
        ("sk-s\u00e9cret\n", "line 1"),
    ],
)
def test_a_bad_key_file_is_named_by_line_without_quoting_it(text: str, where: str) -> None:
    with pytest.raises(KeyFileError) as raised:
        parse_api_keys(text)
    assert where in str(raised.value)
    assert "secret" not in str(raised.value) and "cret" not in str(raised.value)


def test_the_engine_key_is_the_whole_file_stripped() -> None:
    key = parse_engine_key("\n  sk-engine-secret \r\n")
    assert key.header_line == b"authorization: Bearer sk-engine-secret\r\n"
    assert dict(key.probe_headers) == {"Authorization": "Bearer sk-engine-secret"}
    assert "secret" not in repr(key)


@pytest.mark.parametrize("text", ["", "  \n", "sk-one\nsk-two\n", "sk one", "sk-\x7fsecret"])
def test_an_engine_key_file_must_hold_one_printable_key(text: str) -> None:
    with pytest.raises(KeyFileError) as raised:
        parse_engine_key(text)
    assert "sk-" not in str(raised.value)


# -- a key file reloads ----------------------------------------------------------------------


class Applied:
    """What a KeyFile put in force, and in which thread it was parsed."""

    def __init__(self) -> None:
        self.values: list[ApiKeys] = []
        self.parse_threads: set[str] = set()

    def parse(self, text: str) -> ApiKeys:
        self.parse_threads.add(threading.current_thread().name)
        return parse_api_keys(text)

    def admits(self, key: str) -> bool:
        return bool(self.values) and self.values[-1].admits(bearer(key))


def key_file(path: Path, applied: Applied, interval: float = 60.0) -> KeyFile[ApiKeys]:
    return KeyFile(
        path, "--api-keys-file", applied.parse, applied.values.append, check_interval=interval
    )


async def loaded(tmp_path: Path, text: str) -> tuple[Path, Applied, KeyFile[ApiKeys]]:
    """A key file holding `text`, loaded."""
    path = tmp_path / "keys"
    path.write_text(text)
    applied = Applied()
    keys = key_file(path, applied)
    await keys.load()
    return path, applied, keys


async def test_a_key_file_is_read_off_the_event_loop(tmp_path: Path) -> None:
    path, applied, keys = await loaded(tmp_path, "sk-one\n")
    replace_file(path, "sk-two\n")
    assert await keys.check()
    assert applied.parse_threads and threading.main_thread().name not in applied.parse_threads


async def test_a_rewritten_file_replaces_the_keys_and_an_unchanged_one_is_not_reread(
    tmp_path: Path,
) -> None:
    path, applied, keys = await loaded(tmp_path, "sk-one\n")
    assert applied.admits("sk-one")
    assert not await keys.check()  # nothing changed: nothing read
    assert len(applied.values) == 1
    replace_file(path, "sk-two\n")
    assert await keys.check()
    assert applied.admits("sk-two") and not applied.admits("sk-one")


async def test_a_broken_file_keeps_the_keys_in_force_and_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, applied, keys = await loaded(tmp_path, "sk-one\n")
    caplog.set_level(logging.INFO, logger="headcount.auth")
    replace_file(path, "sk-half-written-secret and garbage\n")
    for _ in range(3):
        assert not await keys.check()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "line 1" in errors[0].getMessage()
    assert applied.admits("sk-one")
    path.unlink()
    for _ in range(3):
        assert not await keys.check()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and "No such file" in errors[1].getMessage()
    assert applied.admits("sk-one")
    replace_file(path, "sk-three\n")
    assert await keys.check()
    assert applied.admits("sk-three")
    assert "secret" not in caplog.text and "sk-" not in caplog.text


async def test_a_forced_reload_reads_a_file_whose_identity_did_not_change(tmp_path: Path) -> None:
    """SIGHUP: an in-place rewrite that keeps inode, size and mtime is seen only when asked."""
    path, applied, keys = await loaded(tmp_path, "sk-aaa\n")
    before = os.stat(path)
    with path.open("r+") as file:
        file.write("sk-bbb\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not await keys.check()
    assert applied.admits("sk-aaa")
    assert await keys.check(forced=True)
    assert applied.admits("sk-bbb") and not applied.admits("sk-aaa")


async def test_the_watch_loop_reloads_on_change_and_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("sk-one\n")
    applied, asked = Applied(), Applied()
    polled = key_file(path, applied, interval=0.05)
    on_demand = key_file(path, asked, interval=3600.0)
    await polled.load()
    await on_demand.load()
    tasks = [asyncio.create_task(polled.run()), asyncio.create_task(on_demand.run())]
    try:
        replace_file(path, "sk-two\n")
        await wait_until(lambda: applied.admits("sk-two"), what="the polled file reloaded")
        assert asked.admits("sk-one")
        on_demand.reload_soon()
        await wait_until(lambda: asked.admits("sk-two"), what="the file reloaded when asked")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_storm_of_reloads_of_unchanged_files_says_little(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """500 SIGHUPs: each burst is said once, and a read that finds the keys in force is
    not news; a file that did change still is."""
    keys_path, engine_path = tmp_path / "keys", tmp_path / "engine"
    keys_path.write_text("sk-one\n")
    engine_path.write_text("sk-engine\n")
    auth = Authentication(
        AuthSettings(
            api_keys_file=keys_path, engine_api_key_file=engine_path, key_file_check_interval=3600
        )
    )
    await auth.load()
    caplog.set_level(logging.DEBUG, logger="headcount.auth")
    task = asyncio.create_task(auth.run())

    def reads() -> int:
        return sum("read again" in record.getMessage() for record in caplog.records)

    try:
        for burst in range(1, 6):
            for _ in range(100):
                auth.reload_soon()
            await wait_until(lambda n=2 * burst: reads() >= n, what=f"burst {burst} read")
        info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
        assert info == ["reloading 2 key file(s)"] * 5
        replace_file(keys_path, "sk-two\n")
        auth.reload_soon()
        await wait_until(
            lambda: any("reloaded" in r.getMessage() for r in caplog.records),
            what="the changed file reloaded",
        )
        assert auth.credentials.client_keys is not None
        assert auth.credentials.client_keys.admits(bearer("sk-two"))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_unusable_file_at_start_is_a_config_error_naming_the_flag(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys"
    path.write_text("sk-secret trailing\n")
    with pytest.raises(ConfigError) as raised:
        await key_file(path, Applied()).load()
    message = str(raised.value)
    assert message.startswith("--api-keys-file") and "line 1" in message
    assert "secret" not in message
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="UTF-8"):
        await key_file(path, Applied()).load()


# -- the flags -------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(["--backends", "http://127.0.0.1:9", *argv])


def test_auth_flags_build_settings(tmp_path: Path) -> None:
    keys, engine, tenants = tmp_path / "keys", tmp_path / "engine", tmp_path / "tenants.toml"
    keys.write_text("sk-one\n")
    engine.write_text("sk-engine\n")
    tenants.write_text("[default]\n")
    settings = settings_from_args(
        parse(
            "--api-keys-file",
            str(keys),
            "--engine-api-key-file",
            str(engine),
            "--tenants-file",
            str(tenants),
            "--admin-port",
            "9090",
        )
    )
    assert settings.auth == AuthSettings(
        api_keys_file=keys, engine_api_key_file=engine, tenants_file=tenants
    )
    assert settings.server.admin_port == 9090
    defaults = settings_from_args(parse())
    assert defaults.auth == AuthSettings() and defaults.server.admin_port is None


@pytest.mark.parametrize("flag", ["--api-keys-file", "--engine-api-key-file", "--tenants-file"])
def test_a_missing_key_file_is_named(flag: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^{flag} .*no such file"):
        settings_from_args(parse(flag, str(tmp_path / "absent")))


def test_the_admin_port_must_be_a_port_of_its_own() -> None:
    with pytest.raises(ConfigError, match="--admin-port"):
        ServerSettings(port=8080, admin_port=8080)
    with pytest.raises(ConfigError, match="--admin-port"):
        ServerSettings(port=8080, grpc_health_port=9090, admin_port=9090)
    assert ServerSettings(port=0, admin_port=0).admin_port == 0
