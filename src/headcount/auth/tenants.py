"""Tenants: who a key belongs to, and what that tenant may have of the fleet.

The tenants file (`--tenants-file`, TOML) names tenants, their keys, their
priority, fair-share weight and limits; `[default]` sets the limits of the
`default` tenant (every request without a tenant key), `[objective.NAME]`
objectives that may lower a request's priority:

    [default]
    requests_per_minute = 100

    [[tenant]]
    name = "chat-frontend"
    keys = ["sk-...", "sha256:<64 hex>"]
    priority = 10
    weight = 2
    requests_per_minute = 600
    tokens_per_minute = 400000
    max_concurrency = 64

    [objective.batch]
    priority = -1

`parse_tenants` checks everything once, when the file is read: a name is a
metric label, so it is short and plain; keys read as `--api-keys-file`'s
(`digest.py`) and only their digests are kept; numbers are whole where they
count and bounded. Its errors name the line (tomllib keeps no positions, so
the table headers are found in the text), never a key. `effective_priority`
is the one rule objectives follow.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from headcount.auth.digest import KeyFileError, key_digest

__all__ = [
    "DEFAULT_TENANT",
    "OTHER_TENANT",
    "PRIORITY_BOUND",
    "Tenant",
    "Tenants",
    "effective_priority",
    "parse_tenants",
]

DEFAULT_TENANT = "default"
OTHER_TENANT = "other"
"""The metrics' label for a tenant name they do not know: no tenant may take it."""
PRIORITY_BOUND = 1000
"""Priorities run from -PRIORITY_BOUND to PRIORITY_BOUND."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's place in the queue and its limits (0: unlimited)."""

    name: str
    priority: int = 0
    """Higher is served first; below 0 is sheddable (refused when the fleet is saturated)."""
    weight: float = 1.0
    """Fair share among the tenants of one priority."""
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    """Prompt plus completion tokens."""
    max_concurrency: int = 0
    """Requests in flight, queued or at an engine."""

    @property
    def rate_limited(self) -> bool:
        return self.requests_per_minute > 0 or self.tokens_per_minute > 0


@dataclass(frozen=True, slots=True)
class Tenants:
    """A tenants file as the router holds it: keys as SHA-256 digests, never in clear."""

    by_digest: Mapping[bytes, Tenant] = field(default_factory=dict)
    """A key's SHA-256 digest → its tenant."""
    default: Tenant = field(default_factory=lambda: Tenant(DEFAULT_TENANT))
    objectives: Mapping[str, int] = field(default_factory=dict)
    """`x-gateway-inference-objective` name → the priority it asks for (never above the
    tenant's)."""

    @property
    def names(self) -> frozenset[str]:
        """Every tenant's name, `default` included: the metrics' label values."""
        return frozenset({self.default.name, *(t.name for t in self.by_digest.values())})


def effective_priority(tenant: Tenant, objective: bytes | None, tenants: Tenants | None) -> int:
    """The priority a request is served at: its objective's (the value of
    `x-gateway-inference-objective`) when the file names it and it is lower than its
    tenant's, else its tenant's. An objective the file does not name changes nothing, nor
    does any without a tenants file (`tenants` None)."""
    if objective is None or tenants is None:
        return tenant.priority
    asked = tenants.objectives.get(objective.decode("latin-1"))
    return tenant.priority if asked is None or asked >= tenant.priority else asked


# -- the file --------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_OBJECTIVE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,253}")
"""What a Kubernetes object may be named, as the Gateway API's InferenceObjective is."""
_MAX_LIMIT = 10**12
"""Far above any real limit, well inside the 64-bit counters of a shared store."""
_MIN_WEIGHT, _MAX_WEIGHT = 0.001, 1000.0
"""A million to one is finer than any share an operator means, and keeps the queue's
service-over-weight arithmetic in range."""

_SETTINGS = ("priority", "weight", "requests_per_minute", "tokens_per_minute", "max_concurrency")
_TENANT_FIELDS = ("name", "keys", *_SETTINGS)
_OBJECTIVE_FIELDS = ("priority",)
_TOP = ("tenant", "default", "objective")

_HEADER = re.compile(r"\s*(\[\[|\[)([^\[\]]*)\]")
_KEY_PART = re.compile(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|([A-Za-z0-9_-]+)')
_TOML_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")
_TOML_QUOTES_A_KEY = ("Cannot declare", "Cannot mutate", "Cannot redefine", "Duplicate inline")
_TOML_QUOTES_A_CHARACTER = ("Found invalid character", "Illegal character")


def parse_tenants(text: str) -> Tenants:
    """The tenants of a tenants file's text; `KeyFileError` names the line of what is wrong."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(exc, text) from None
    lines = _Lines(text)
    for name in document:
        if name not in _TOP:
            raise _unknown(name, _TOP, f"line {lines.top(name)}", "top-level table")
    default = _default(document.get("default"), lines)
    tenants = _tenants(document.get("tenant"), lines)
    objectives = _objectives(document.get("objective"), lines)
    if not tenants and "default" not in document:
        raise KeyFileError("no [[tenant]] and no [default] in the file")
    by_digest: dict[bytes, Tenant] = {}
    first_with: dict[bytes, str] = {}
    for where, tenant, digests in tenants:
        for number, digest in enumerate(digests, 1):
            if digest in first_with:
                raise KeyFileError(f"{where}: key {number} is also {first_with[digest]}'s")
            by_digest[digest] = tenant
            first_with[digest] = where
    return Tenants(by_digest=by_digest, default=default, objectives=objectives)


def _default(table: object, lines: _Lines) -> Tenant:
    if table is None:
        return Tenant(DEFAULT_TENANT)
    where = f"[default] (line {lines.table('default')})"
    if not isinstance(table, dict):
        raise KeyFileError(f"{where}: must be a table of settings")
    for name in table:
        if name in ("name", "keys"):
            raise KeyFileError(
                f"{where}: [default] takes no {name}: it is every request without a tenant key"
            )
        if name not in _SETTINGS:
            raise _unknown(name, _SETTINGS, where)
    return _tenant(DEFAULT_TENANT, table, where)


def _tenants(tables: object, lines: _Lines) -> list[tuple[str, Tenant, list[bytes]]]:
    """Each tenant with where it is (for messages) and its keys' digests."""
    if tables is None:
        return []
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise KeyFileError(f"line {lines.top('tenant')}: `tenant` must be [[tenant]] tables")
    found: list[tuple[str, Tenant, list[bytes]]] = []
    names: dict[str, str] = {}
    for index, table in enumerate(tables):
        line = lines.tenant(index, len(tables))
        name = table.get("name")
        plain = isinstance(name, str) and _NAME.fullmatch(name) is not None
        where = f'tenant "{name}" (line {line})' if plain else f"tenant #{index + 1} (line {line})"
        for key in table:
            if key not in _TENANT_FIELDS:
                raise _unknown(key, _TENANT_FIELDS, where)
        if name is None:
            raise KeyFileError(f"{where}: a tenant needs a name")
        if not isinstance(name, str) or not plain:
            raise KeyFileError(f"{where}: a name is 1 to 64 letters, digits, '_', '.' or '-'")
        if name in (DEFAULT_TENANT, OTHER_TENANT):
            raise KeyFileError(
                f'{where}: "{name}" is reserved ("default": requests without a tenant key, '
                'set in [default]; "other": the metrics\' unknown names)'
            )
        if name in names:
            raise KeyFileError(f"{where}: the name is taken by {names[name]}")
        names[name] = where
        found.append((where, _tenant(name, table, where), _digests(table.get("keys", []), where)))
    return found


def _digests(keys: object, where: str) -> list[bytes]:
    if not isinstance(keys, list):
        raise KeyFileError(f"{where}: keys must be a list of strings")
    numbers: dict[bytes, int] = {}
    for number, key in enumerate(keys, 1):
        if not isinstance(key, str):
            raise KeyFileError(f"{where}: key {number} must be a string")
        digest = key_digest(key, f"{where}: key {number}")
        if digest in numbers:
            raise KeyFileError(f"{where}: key {number} repeats key {numbers[digest]}")
        numbers[digest] = number
    return list(numbers)


def _objectives(tables: object, lines: _Lines) -> dict[str, int]:
    if tables is None:
        return {}
    if not isinstance(tables, dict):
        raise KeyFileError(f"line {lines.top('objective')}: write objectives as [objective.NAME]")
    objectives: dict[str, int] = {}
    for name, table in tables.items():
        line = lines.table("objective", name)
        if _OBJECTIVE_NAME.fullmatch(name) is None:
            raise KeyFileError(
                f"an objective (line {line}): a name is 1 to 253 letters, digits, '_', '.' or '-'"
            )
        where = f"[objective.{name}] (line {line})"
        if not isinstance(table, dict):
            raise KeyFileError(f"{where}: must be a table holding priority")
        for key in table:
            if key not in _OBJECTIVE_FIELDS:
                raise _unknown(key, _OBJECTIVE_FIELDS, where)
        if "priority" not in table:
            raise KeyFileError(f"{where}: an objective needs a priority")
        objectives[name] = _priority(table["priority"], where)
    return objectives


def _tenant(name: str, table: Mapping[str, object], where: str) -> Tenant:
    return Tenant(
        name,
        priority=_priority(table.get("priority", 0), where),
        weight=_weight(table.get("weight", 1.0), where),
        requests_per_minute=_limit(table, "requests_per_minute", where),
        tokens_per_minute=_limit(table, "tokens_per_minute", where),
        max_concurrency=_limit(table, "max_concurrency", where),
    )


def _whole(value: object, low: int, high: int) -> int | None:
    """`value` if it is a whole number from `low` to `high` (TOML's true is not 1)."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def _priority(value: object, where: str) -> int:
    priority = _whole(value, -PRIORITY_BOUND, PRIORITY_BOUND)
    if priority is None:
        raise KeyFileError(
            f"{where}: priority must be a whole number from {-PRIORITY_BOUND} to {PRIORITY_BOUND}"
        )
    return priority


def _weight(value: object, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not _MIN_WEIGHT <= value <= _MAX_WEIGHT
    ):
        raise KeyFileError(
            f"{where}: weight must be a number from {_MIN_WEIGHT} to {_MAX_WEIGHT:g}"
        )
    return float(value)


def _limit(table: Mapping[str, object], name: str, where: str) -> int:
    limit = _whole(table.get(name, 0), 0, _MAX_LIMIT)
    if limit is None:
        raise KeyFileError(f"{where}: {name} must be a whole number from 0 (unlimited) to 10^12")
    return limit


def _unknown(name: str, known: Sequence[str], where: str, kind: str = "field") -> KeyFileError:
    """An unknown name is quoted only when it is close to a known one: anything else might be
    a key written in the wrong place."""
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return KeyFileError(f'{where}: unknown {kind} "{name}" (did you mean "{close[0]}"?)')
    return KeyFileError(f"{where}: an unknown {kind} (known: {', '.join(known)})")


def _syntax_error(exc: tomllib.TOMLDecodeError, text: str) -> KeyFileError:
    """tomllib's message with its position first; never a key it might quote."""
    message = str(exc)
    at = _TOML_AT.search(message)
    what = message[: at.start()] if at else message
    if what.startswith(_TOML_QUOTES_A_KEY):
        what = "a key or table defined twice"
    elif what.startswith(_TOML_QUOTES_A_CHARACTER):
        what = "a character TOML does not allow there"
    if at is None or at.group(1) is None:
        last = text.count("\n") + 1
        return KeyFileError(f"line {last}, the end: not TOML: {what}")
    return KeyFileError(f"line {at.group(1)}, column {at.group(2)}: not TOML: {what}")


class _Lines:
    """Where the tables are in the file's text: tomllib keeps no positions. A table written
    inline (`tenant = [{...}]`) is placed at the line of its key."""

    def __init__(self, text: str) -> None:
        self._rows = text.split("\n")  # as tomllib counts lines
        self._headers: list[tuple[int, bool, tuple[str, ...]]] = []
        """(line, an array of tables?, the header's dotted key as parts)."""
        for number, row in enumerate(self._rows, 1):
            match = _HEADER.match(row)
            if match is not None:
                parts = tuple(
                    next(part for part in key.groups() if part is not None)
                    for key in _KEY_PART.finditer(match.group(2))
                )
                self._headers.append((number, match.group(1) == "[[", parts))

    def tenant(self, index: int, count: int) -> int:
        """The line of the `index`th of `count` tenants."""
        found = [line for line, array, parts in self._headers if array and parts == ("tenant",)]
        return found[index] if len(found) == count else self.top("tenant")

    def table(self, *parts: str) -> int:
        for line, array, found in self._headers:
            if not array and found == parts:
                return line
        return self.top(parts[0])

    def top(self, name: str) -> int:
        """The first line that names the top-level `name`: a header, else an assignment."""
        for line, _, parts in self._headers:
            if parts[:1] == (name,):
                return line
        assignment = re.compile(rf"""\s*(["']?){re.escape(name)}\1\s*[.=]""")
        for number, row in enumerate(self._rows, 1):
            if assignment.match(row):
                return number
        return 1
