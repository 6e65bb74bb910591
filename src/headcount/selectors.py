"""Kubernetes label and field selector syntax, parsed as ``k8s.io/apimachinery`` does.

One grammar for two readers: `serve` validates `--label-selector` at start
(a selector the API server would refuse is a bad flag, exit 2, not a LIST
retried forever with `HTTP 400`), and the API server emulator parses and
matches with it, so that what one accepts the other does.

Label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`,
`!k`, `k>1`, `k<1`, joined by commas. Field selectors: `path=v`, `path==v`,
`path!=v`, joined by unescaped commas (which paths a resource supports is the
server's to say).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "FieldTerm",
    "Requirement",
    "SelectorError",
    "parse_field_selector",
    "parse_label_selector",
    "valid_dns_subdomain",
    "valid_label_key",
    "valid_label_value",
]

_INTEGER = re.compile(r"-?[0-9]{1,19}")
_SELECTOR_TOKEN = re.compile(r"==|!=|=|!|,|\(|\)|<|>|[^\s!=,()<>]+")
_SELECTOR_SYMBOLS = frozenset({"==", "!=", "=", "!", ",", "(", ")", "<", ">"})
_UNESCAPED_COMMA = re.compile(r"(?<!\\),")
_FIELD_TERM = re.compile(r"(.*?)(!=|==|=)(.*)", re.DOTALL)
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class SelectorError(ValueError):
    """A selector the API server would refuse; the message is the server's."""


def valid_dns_subdomain(name: str) -> bool:
    """A DNS subdomain (RFC 1123), as most object names and a label key's prefix must be."""
    return len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name) is not None


def valid_label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and not valid_dns_subdomain(prefix):
        return False
    return len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def valid_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _QUALIFIED_NAME.fullmatch(value) is not None)


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector: ``key op values``."""

    key: str
    operator: Literal["=", "!=", "in", "notin", "exists", "!", ">", "<"]
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "exists":
                return value is not None
            case "!":
                return value is None
            case "=" | "in":
                return value in self.values
            case "!=" | "notin":
                return value not in self.values
        if value is None or not _INTEGER.fullmatch(value):
            return False
        bound = int(next(iter(self.values)))
        return int(value) > bound if self.operator == ">" else int(value) < bound


class _SelectorParser:
    """The label selector grammar of ``k8s.io/apimachinery/pkg/labels``."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._tokens = _SELECTOR_TOKEN.findall(text)
        self._at = 0

    def parse(self) -> tuple[Requirement, ...]:
        if not self._tokens:
            return ()
        requirements = [self._requirement()]
        while self._peek() == ",":
            self._at += 1
            requirements.append(self._requirement())
        if self._peek() is not None:
            raise self._error(f"found '{self._peek()}', expected: ',' or 'end of string'")
        return tuple(requirements)

    def _peek(self) -> str | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _take(self) -> str | None:
        token = self._peek()
        self._at += 1
        return token

    def _error(self, message: str) -> SelectorError:
        return SelectorError(f"unable to parse requirement: {message} in {self._text!r}")

    def _key(self) -> str:
        key = self._take()
        if key is None or key in _SELECTOR_SYMBOLS or not valid_label_key(key):
            raise self._error(f"invalid label key {key!r}")
        return key

    def _value(self) -> str:
        if self._peek() in _SELECTOR_SYMBOLS or self._peek() is None:
            return ""  # `a=` and `in (a,)` name the empty value
        value = self._take() or ""
        if not valid_label_value(value):
            raise self._error(f"invalid label value {value!r}")
        return value

    def _requirement(self) -> Requirement:
        if self._peek() == "!":
            self._at += 1
            return Requirement(self._key(), "!")
        key = self._key()
        operator = self._peek()
        if operator is None or operator == ",":
            return Requirement(key, "exists")
        self._at += 1
        if operator in ("=", "==", "!="):
            return Requirement(key, "!=" if operator == "!=" else "=", frozenset({self._value()}))
        if operator in ("in", "notin"):
            return Requirement(key, "in" if operator == "in" else "notin", self._value_set())
        if operator in (">", "<"):
            bound = self._take()
            if bound is None or not _INTEGER.fullmatch(bound):
                raise self._error(f"for '{operator}', the value must be an integer")
            return Requirement(key, ">" if operator == ">" else "<", frozenset({bound}))
        raise self._error(f"found '{operator}', expected an operator")

    def _value_set(self) -> frozenset[str]:
        if self._take() != "(":
            raise self._error("expected '(' after 'in' or 'notin'")
        if self._peek() == ")":
            raise self._error("for 'in', 'notin' operators, values set can't be empty")
        values = {self._value()}
        while self._peek() == ",":
            self._at += 1
            values.add(self._value())
        if self._take() != ")":
            raise self._error("expected ')' to close the value set")
        return frozenset(values)


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """The requirements of a label selector (all must match); `SelectorError` if malformed."""
    return _SelectorParser(text).parse()


@dataclass(frozen=True)
class FieldTerm:
    """One term of a field selector: a field path equal, or not, to a value."""

    key: str
    """The dotted path, e.g. `status.phase`."""
    value: str
    equal: bool


def parse_field_selector(text: str) -> tuple[FieldTerm, ...]:
    """The terms of a field selector (all must match); `SelectorError` if malformed."""
    terms = []
    for term in _UNESCAPED_COMMA.split(text) if text else ():
        match = _FIELD_TERM.match(term)
        if match is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        key, operator, value = match.groups()
        value = value.replace("\\,", ",").replace("\\=", "=").replace("\\\\", "\\")
        terms.append(FieldTerm(key, value, operator != "!="))
    return tuple(terms)
