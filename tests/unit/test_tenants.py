"""Tenants: the file read and checked, the priority objectives give, keys merged and reloaded.

The parser on texts in memory (every error names its line and never a key),
`effective_priority` over generated priorities, and `Authentication` on real
files in a temporary directory: both key files merged into one lookup, and
the reloads that are refused because they would change whether a key is needed.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headcount.auth import (
    Authentication,
    Credentials,
    KeyFileError,
    Tenant,
    Tenants,
    effective_priority,
    parse_tenants,
)
from headcount.config import AuthSettings, ConfigError
from tests.support.key_files import bearer, replace_file

__all__: list[str] = []

SECRET = "sk-secret-7f3a"
"""A key that must never appear in a message."""
HASHED = "sk-hashed-secret-91c2"

EXAMPLE = f"""\
[default]                  # requests without a tenant key
requests_per_minute = 100

[[tenant]]
name = "chat-frontend"
keys = ["{SECRET}", "sha256:{hashlib.sha256(HASHED.encode()).hexdigest()}"]
priority = 10
weight = 2
requests_per_minute = 600
tokens_per_minute = 400000
max_concurrency = 64

[[tenant]]
name = "batch.nightly_2"
keys = ["sk-batch"]

[objective.batch]
priority = -1
"""


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def tenant(name: str, text: str) -> str:
    """A tenant table holding `text` beside its name."""
    return f'[[tenant]]\nname = "{name}"\n{text}\n'


# -- the file --------------------------------------------------------------------------------


def test_the_issues_example_is_read_whole() -> None:
    tenants = parse_tenants(EXAMPLE)
    chat = Tenant("chat-frontend", 10, 2.0, 600, 400_000, 64)
    assert tenants.by_digest == {
        digest(SECRET): chat,
        digest(HASHED): chat,
        digest("sk-batch"): Tenant("batch.nightly_2"),
    }
    assert tenants.default == Tenant("default", requests_per_minute=100)
    assert tenants.objectives == {"batch": -1}
    assert tenants.names == {"default", "chat-frontend", "batch.nightly_2"}
    assert SECRET not in repr(tenants) and HASHED not in repr(tenants)


def test_a_file_of_only_default_or_only_tenants_is_enough() -> None:
    only_default = parse_tenants("[default]\nmax_concurrency = 8\n")
    assert only_default == Tenants(default=Tenant("default", max_concurrency=8))
    only_tenants = parse_tenants(tenant("a", 'keys = ["sk-a"]'))
    assert only_tenants.default == Tenant("default")
    assert only_tenants.by_digest == {digest("sk-a"): Tenant("a")}


def test_a_tenant_may_have_no_key_so_that_its_last_one_can_be_revoked() -> None:
    tenants = parse_tenants(tenant("a", "keys = []") + tenant("b", "priority = 3"))
    assert tenants.by_digest == {}


def test_a_whole_weight_is_a_weight_and_limits_are_whole() -> None:
    tenants = parse_tenants(tenant("a", 'keys = ["sk-a"]\nweight = 3\ntokens_per_minute = 0'))
    assert tenants.by_digest[digest("sk-a")].weight == 3.0
    assert isinstance(tenants.by_digest[digest("sk-a")].weight, float)


SYNTAX = f'[[tenant]]\nname = "a"\nkeys = ["{SECRET}"\n'
INLINE = f'# tenants\ntenant = [{{name = "a", keys = ["{SECRET}"]}}, {{name = "a"}}]\n'
THIRD_BAD = tenant("a", "") + tenant("b", "") + tenant("c", "priority = 1.5")


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        (SYNTAX, "line 4, the end", "not TOML: Unclosed array"),
        ("[default]\npriority = \n", "line 2, column 12", "not TOML: Invalid value"),
        (f'"{SECRET}" = 1\n"{SECRET}" = 2\n', "line 2", "not TOML"),
        (f'[objective."{SECRET}"]\n[objective."{SECRET}"]\n', "line 2", "defined twice"),
        ("[default]\npriority = 1\nweight = ", "line 3, the end", "not TOML"),
        ("[tenants]\n", "line 1", 'unknown top-level table "tenants" (did you mean "tenant"?)'),
        (f'\n"{SECRET}" = 1\n', "line 2", "an unknown top-level table (known: tenant, default"),
        ('[[tenant]]\nkeys = ["sk-a"]\n', "tenant #1 (line 1)", "a tenant needs a name"),
        (tenant("", ""), "tenant #1 (line 1)", "a name is 1 to 64 letters"),
        (tenant(SECRET + " x", ""), "tenant #1 (line 1)", "a name is 1 to 64"),
        (tenant("a" * 65, ""), "tenant #1 (line 1)", "a name is 1 to 64"),
        ("[[tenant]]\nname = 7\n", "tenant #1 (line 1)", "a name is"),
        (tenant("default", ""), 'tenant "default" (line 1)', "reserved"),
        (tenant("other", ""), 'tenant "other" (line 1)', "reserved"),
        (tenant("a", "") + "\n" + tenant("a", ""), 'tenant "a" (line 5)', 'by tenant "a" (line 1)'),
        (
            tenant("a", "requests_per_minut = 5"),
            'tenant "a" (line 1)',
            'unknown field "requests_per_minut" (did you mean "requests_per_minute"?)',
        ),
        (tenant("a", f'"{SECRET}" = 1'), 'tenant "a" (line 1)', "an unknown field (known: name"),
        (tenant("a", f'keys = "{SECRET}"'), 'tenant "a" (line 1)', "keys must be a list"),
        (tenant("a", 'keys = ["sk-a", 5]'), 'tenant "a" (line 1)', "key 2 must be a string"),
        (tenant("a", 'keys = [""]'), 'tenant "a" (line 1)', "key 1: a key must not be empty"),
        (tenant("a", f'keys = ["{SECRET} x"]'), 'tenant "a" (line 1)', "key 1: a key must be"),
        (tenant("a", f'keys = ["{SECRET}\\u00e9"]'), 'tenant "a" (line 1)', "printable ASCII"),
        (tenant("a", 'keys = ["sha256:secret"]'), 'tenant "a" (line 1)', "64 hex digits"),
        (
            tenant("a", f'keys = ["{SECRET}", "sha256:{digest(SECRET).hex()}"]'),
            'tenant "a" (line 1)',
            "key 2 repeats key 1",
        ),
        (
            tenant("a", f'keys = ["{SECRET}"]') + tenant("b", f'keys = ["sk-b", "{SECRET}"]'),
            'tenant "b" (line 4)',
            'key 2 is also tenant "a" (line 1)\'s',
        ),
        (tenant("a", "priority = true"), 'tenant "a" (line 1)', "priority must be a whole"),
        (tenant("a", "priority = 1.0"), 'tenant "a" (line 1)', "priority must be a whole"),
        (tenant("a", "priority = 1001"), 'tenant "a" (line 1)', "from -1000 to 1000"),
        (tenant("a", "priority = -1001"), 'tenant "a" (line 1)', "from -1000 to 1000"),
        (tenant("a", "weight = 0"), 'tenant "a" (line 1)', "weight must be a number"),
        (tenant("a", "weight = -2"), 'tenant "a" (line 1)', "weight must be a number"),
        (tenant("a", "weight = inf"), 'tenant "a" (line 1)', "weight must be a number"),
        (tenant("a", "weight = nan"), 'tenant "a" (line 1)', "weight must be a number"),
        (tenant("a", "weight = true"), 'tenant "a" (line 1)', "weight must be a number"),
        (tenant("a", 'weight = "2"'), 'tenant "a" (line 1)', "weight must be a number"),
        (tenant("a", "weight = 1001"), 'tenant "a" (line 1)', "from 0.001 to 1000"),
        (tenant("a", "max_concurrency = -1"), 'tenant "a" (line 1)', "max_concurrency must be"),
        (tenant("a", "tokens_per_minute = 1.5"), 'tenant "a" (line 1)', "tokens_per_minute must"),
        (tenant("a", "requests_per_minute = false"), 'tenant "a" (line 1)', "requests_per_minute"),
        (
            tenant("a", "requests_per_minute = 1_000_000_000_001"),
            'tenant "a" (line 1)',
            "from 0 (unlimited) to 10^12",
        ),
        (THIRD_BAD, 'tenant "c" (line 7)', "priority must be a whole"),
        (INLINE, 'tenant "a" (line 2)', "taken by"),
        ("tenant = 3\n", "line 1", "`tenant` must be [[tenant]] tables"),
        ("\n[tenant]\nname = 'a'\n", "line 2", "`tenant` must be [[tenant]] tables"),
        (f'[default]\nkeys = ["{SECRET}"]\n', "[default] (line 1)", "takes no keys"),
        ('\n[default]\nname = "x"\n', "[default] (line 2)", "takes no name"),
        ("[default]\nwieght = 2\n", "[default] (line 1)", 'did you mean "weight"?'),
        ("[default]\npriority = 1.5\n", "[default] (line 1)", "priority must be a whole"),
        ("default = 3\n", "[default] (line 1)", "must be a table"),
        ("[default]\n[objective.batch]\n", "[objective.batch] (line 2)", "needs a priority"),
        ("[objective.b]\npriority = 1\nlevel = 2\n", "[objective.b] (line 1)", "unknown field"),
        ("[objective.b]\npriority = 2000\n", "[objective.b] (line 1)", "from -1000 to 1000"),
        ("[default]\nobjective = 3\n", "[default] (line 1)", "an unknown field"),
        ("\nobjective = 3\n", "line 2", "write objectives as [objective.NAME]"),
        ("objective.b = 3\n", "[objective.b] (line 1)", "must be a table holding priority"),
        (f'[objective."{SECRET} x"]\npriority = 1\n', "an objective (line 1)", "a name is 1"),
    ],
)
def test_every_error_names_its_line_and_never_a_key(text: str, line: str, needle: str) -> None:
    with pytest.raises(KeyFileError) as raised:
        parse_tenants(text)
    message = str(raised.value)
    assert message.startswith(line), message
    assert needle in message, message
    assert "secret" not in message, message


def test_a_file_with_no_tenant_and_no_default_is_refused() -> None:
    for text in ("", "# nothing yet\n", "[objective.batch]\npriority = -1\n"):
        with pytest.raises(KeyFileError, match=r"no \[\[tenant\]\] and no \[default\]"):
            parse_tenants(text)


def test_a_header_inside_a_multiline_string_does_not_shift_the_lines() -> None:
    """The headers are found by scanning the text; when that count disagrees with tomllib's,
    the tenants are placed at the first `tenant` line rather than at a wrong one."""
    text = '[default]\nweight = 1\n# """\n' + tenant("a", 'x = """\n[[tenant]]\n"""')
    with pytest.raises(KeyFileError) as raised:
        parse_tenants(text)
    assert str(raised.value).startswith('tenant "a" (line 4)')


# -- objectives --------------------------------------------------------------------------------


OBJECTIVES = parse_tenants(
    "[default]\n[objective.batch]\npriority = -1\n[objective.gold]\npriority = 50\n"
)


@pytest.mark.parametrize(
    ("priority", "objective", "expected"),
    [
        (10, None, 10),
        (10, b"batch", -1),
        (10, b"gold", 10),  # never raised above the tenant's
        (100, b"gold", 50),
        (-5, b"batch", -5),
        (10, b"unknown", 10),
        (10, b"Batch", 10),  # names are exact
        (10, b"\xffbatch", 10),
    ],
)
def test_an_objective_may_lower_a_priority_never_raise_it(
    priority: int, objective: bytes | None, expected: int
) -> None:
    assert effective_priority(Tenant("t", priority), objective, OBJECTIVES) == expected


def test_without_a_tenants_file_no_objective_changes_a_priority() -> None:
    assert effective_priority(Tenant("default", 3), b"batch", None) == 3


@given(
    priority=st.integers(-1000, 1000),
    asked=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(-1000, 1000)),
    objective=st.sampled_from([None, b"a", b"b", b"c", b"d"]),
)
def test_the_effective_priority_is_the_lower_of_the_two_when_the_objective_is_known(
    priority: int, asked: dict[str, int], objective: bytes | None
) -> None:
    tenants = Tenants(objectives=asked)
    result = effective_priority(Tenant("t", priority), objective, tenants)
    known = None if objective is None else asked.get(objective.decode())
    assert result == (priority if known is None else min(priority, known))


# -- keys of both files, merged and reloaded ---------------------------------------------------


FILE_KEY = "sk-file-secret-01"
TENANT_KEY = "sk-tenant-secret-02"
TENANTS = f"""\
[default]
requests_per_minute = 100

[[tenant]]
name = "chat"
keys = ["{TENANT_KEY}"]
priority = 10
"""


async def authentication(
    tmp_path: Path, *, keys: str | None = None, tenants: str | None = None
) -> Authentication:
    """`Authentication` of the files given, loaded."""
    settings = {}
    if keys is not None:
        settings["api_keys_file"] = tmp_path / "keys"
        settings["api_keys_file"].write_text(keys)
    if tenants is not None:
        settings["tenants_file"] = tmp_path / "tenants.toml"
        settings["tenants_file"].write_text(tenants)
    auth = Authentication(AuthSettings(**settings, key_file_check_interval=3600))
    await auth.load()
    return auth


def tenant_file(auth: Authentication):  # type: ignore[no-untyped-def]
    [found] = [f for f in auth.files if f.flag == "--tenants-file"]
    return found


async def test_both_files_keys_are_one_lookup_each_with_its_tenant(tmp_path: Path) -> None:
    auth = await authentication(tmp_path, keys=f"{FILE_KEY}\n{TENANT_KEY}\n", tenants=TENANTS)
    credentials = auth.credentials
    keys = credentials.client_keys
    assert keys is not None and len(keys) == 2
    default = Tenant("default", requests_per_minute=100)
    chat = Tenant("chat", priority=10)
    assert keys.tenant(bearer(FILE_KEY)) == default  # the tenants file's default tenant
    assert keys.tenant(bearer(TENANT_KEY)) == chat  # a key in both files is its tenant's
    assert keys.tenant(bearer("sk-unknown")) is None and not keys.admits(bearer("sk-unknown"))
    assert credentials.tenant_of(bearer(TENANT_KEY)) == chat
    assert credentials.tenant_of(bearer(FILE_KEY)) == default
    assert credentials.tenants is not None and credentials.tenants.default == default
    assert credentials.forward_authorization == b""  # the router's keys never reach engines


async def test_either_file_reloading_remerges_the_keys(tmp_path: Path) -> None:
    auth = await authentication(tmp_path, keys=f"{FILE_KEY}\n", tenants=TENANTS)
    keys_file, tenants_file = auth.files
    replace_file(tenants_file.path, TENANTS.replace("100", "5").replace("chat", "chat-2"))
    assert await tenants_file.check()
    credentials = auth.credentials
    assert credentials.tenant_of(bearer(FILE_KEY)) == Tenant("default", requests_per_minute=5)
    assert credentials.tenant_of(bearer(TENANT_KEY)) == Tenant("chat-2", priority=10)
    replace_file(keys_file.path, "sk-file-secret-03\n")
    assert await keys_file.check()
    keys = credentials.client_keys
    assert keys is not None and not keys.admits(bearer(FILE_KEY))
    assert keys.tenant(bearer("sk-file-secret-03")) == Tenant("default", requests_per_minute=5)
    assert keys.tenant(bearer(TENANT_KEY)) == Tenant("chat-2", priority=10)


async def test_the_tenants_files_keys_alone_require_a_key(tmp_path: Path) -> None:
    auth = await authentication(tmp_path, tenants=TENANTS)
    keys = auth.credentials.client_keys
    assert keys is not None and keys.admits(bearer(TENANT_KEY))
    assert not keys.admits(bearer(FILE_KEY)) and not keys.admits([])
    assert auth.credentials.forward_authorization == b""


async def test_a_tenants_file_without_keys_leaves_the_router_open_as_tenant_default(
    tmp_path: Path,
) -> None:
    auth = await authentication(tmp_path, tenants="[default]\nmax_concurrency = 4\n")
    credentials = auth.credentials
    assert credentials.client_keys is None
    assert credentials.forward_authorization is None  # the client's passes through, as before
    assert credentials.tenant_of([]) == Tenant("default", max_concurrency=4)
    assert credentials.tenant_of(bearer("sk-anything")) == Tenant("default", max_concurrency=4)


def test_without_files_everyone_is_a_plain_default_tenant_and_flow_control_is_off() -> None:
    credentials = Credentials()
    assert credentials.tenants is None and credentials.client_keys is None
    assert credentials.tenant_of(bearer("sk-any")) == Tenant("default")


def test_until_the_tenants_file_is_loaded_no_client_is_admitted() -> None:
    credentials = Credentials(tenants=True)
    assert credentials.client_keys is not None and not credentials.client_keys.admits(bearer("x"))
    assert credentials.forward_authorization == b""


async def test_a_reload_dropping_every_key_is_refused_and_the_keys_stay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auth = await authentication(tmp_path, tenants=TENANTS)
    caplog.set_level(logging.INFO, logger="headcount.auth")
    tenants_file = tenant_file(auth)
    replace_file(tenants_file.path, TENANTS.replace(f'"{TENANT_KEY}"', ""))
    assert not await tenants_file.check()
    keys = auth.credentials.client_keys
    assert keys is not None and keys.tenant(bearer(TENANT_KEY)) == Tenant("chat", priority=10)
    [error] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.startswith("--tenants-file ") and "would be open to anyone" in error
    assert "secret" not in caplog.text


async def test_a_reload_dropping_the_tenants_keys_beside_a_key_file_is_taken(
    tmp_path: Path,
) -> None:
    auth = await authentication(tmp_path, keys=f"{FILE_KEY}\n", tenants=TENANTS)
    tenants_file = tenant_file(auth)
    replace_file(tenants_file.path, "[default]\npriority = 3\n")
    assert await tenants_file.check()
    keys = auth.credentials.client_keys
    assert keys is not None and not keys.admits(bearer(TENANT_KEY))
    assert keys.tenant(bearer(FILE_KEY)) == Tenant("default", priority=3)


async def test_a_reload_bringing_keys_to_a_router_started_open_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auth = await authentication(tmp_path, tenants="[default]\n")
    caplog.set_level(logging.INFO, logger="headcount.auth")
    tenants_file = tenant_file(auth)
    replace_file(tenants_file.path, TENANTS)
    assert not await tenants_file.check()
    assert auth.credentials.client_keys is None
    assert auth.credentials.forward_authorization is None
    assert "restart it to require keys" in caplog.text and "secret" not in caplog.text
    replace_file(tenants_file.path, "[default]\npriority = -1\n")  # still open: taken
    assert await tenants_file.check()
    assert auth.credentials.tenant_of([]) == Tenant("default", priority=-1)


async def test_a_bad_reload_keeps_the_tenants_in_force_and_says_where(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auth = await authentication(tmp_path, tenants=TENANTS)
    caplog.set_level(logging.INFO, logger="headcount.auth")
    tenants_file = tenant_file(auth)
    replace_file(tenants_file.path, TENANTS.replace("priority = 10", "priority = high"))
    assert not await tenants_file.check()
    assert auth.credentials.tenant_of(bearer(TENANT_KEY)) == Tenant("chat", priority=10)
    assert "--tenants-file" in caplog.text and "line 7, column 12" in caplog.text
    assert "secret" not in caplog.text


async def test_an_unusable_tenants_file_at_start_names_the_flag_and_the_line(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError) as raised:
        await authentication(tmp_path, tenants=TENANTS.replace("name", "nmae"))
    message = str(raised.value)
    assert message.startswith("--tenants-file ") and "tenant #1 (line 4)" in message
    assert 'did you mean "name"?' in message and "secret" not in message
