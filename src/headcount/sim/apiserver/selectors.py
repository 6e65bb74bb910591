"""Label and field selectors, parsed and matched as ``k8s.io/apimachinery`` does.

Discovery selects its pods by label; a selector the real server would refuse
must answer 400 here, and one it accepts must select the same objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from headcount.sim.apiserver.objects import JsonObject, field
from headcount.sim.apiserver.resources import Resource
from headcount.sim.apiserver.status import StatusError, bad_request
from headcount.sim.apiserver.validation import valid_label_key, valid_label_value

__all__ = [
    "FieldRequirement",
    "Requirement",
    "parse_field_selector",
    "parse_label_selector",
]

_INTEGER = re.compile(r"-?[0-9]{1,19}")
_SELECTOR_TOKEN = re.compile(r"==|!=|=|!|,|\(|\)|<|>|[^\s!=,()<>]+")
_SELECTOR_SYMBOLS = frozenset({"==", "!=", "=", "!", ",", "(", ")", "<", ">"})
_UNESCAPED_COMMA = re.compile(r"(?<!\\),")


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

    def _error(self, message: str) -> StatusError:
        return bad_request(f"unable to parse requirement: {message} in {self._text!r}")

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
    return _SelectorParser(text).parse()


@dataclass(frozen=True)
class FieldRequirement:
    """One term of a field selector: a field path equal, or not, to a value."""

    path: tuple[str, ...]
    value: str
    equal: bool

    def matches(self, obj: JsonObject) -> bool:
        actual = field(obj, *self.path)
        return (("" if actual is None else str(actual)) == self.value) == self.equal


def parse_field_selector(text: str, resource: Resource) -> tuple[FieldRequirement, ...]:
    requirements = []
    for term in _UNESCAPED_COMMA.split(text) if text else ():
        match = re.match(r"(.*?)(!=|==|=)(.*)", term, re.DOTALL)
        if match is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        key, operator, value = match.groups()
        if key not in resource.field_labels:
            raise bad_request(f'field label not supported: "{key}"')
        value = value.replace("\\,", ",").replace("\\=", "=").replace("\\\\", "\\")
        requirements.append(FieldRequirement(tuple(key.split(".")), value, operator != "!="))
    return tuple(requirements)
