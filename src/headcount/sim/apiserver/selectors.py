"""Label and field selectors as the API server applies them: parsed by the shared grammar
(`headcount.selectors`), refused with a 400 as the real server does, and matched.

Discovery selects its pods by label; a selector the real server would refuse
must answer 400 here, and one it accepts must select the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from headcount.selectors import Requirement, SelectorError
from headcount.selectors import parse_field_selector as _parse_field_terms
from headcount.selectors import parse_label_selector as _parse_label
from headcount.sim.apiserver.objects import JsonObject, field
from headcount.sim.apiserver.resources import Resource
from headcount.sim.apiserver.status import bad_request

__all__ = [
    "FieldRequirement",
    "Requirement",
    "parse_field_selector",
    "parse_label_selector",
]


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    try:
        return _parse_label(text)
    except SelectorError as exc:
        raise bad_request(str(exc)) from None


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
    try:
        terms = _parse_field_terms(text)
    except SelectorError as exc:
        raise bad_request(str(exc)) from None
    requirements = []
    for term in terms:
        if term.key not in resource.field_labels:
            raise bad_request(f'field label not supported: "{term.key}"')
        requirements.append(FieldRequirement(tuple(term.key.split(".")), term.value, term.equal))
    return tuple(requirements)
