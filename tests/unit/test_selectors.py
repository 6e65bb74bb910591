"""The selector grammar accepts and refuses what the API server does, and matches alike."""

from __future__ import annotations

import pytest

from headcount.selectors import (
    FieldTerm,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)


def test_every_label_operator_parses_and_matches() -> None:
    requirements = parse_label_selector("app=vllm,tier!=cpu,model in (a,b),!draining,gpu,n>1")
    labels = {"app": "vllm", "tier": "gpu", "model": "a", "gpu": "", "n": "2"}
    assert all(requirement.matches(labels) for requirement in requirements)
    assert not all(requirement.matches({**labels, "draining": "1"}) for requirement in requirements)


@pytest.mark.parametrize(
    ("selector", "why"),
    [
        ("app in (a", "expected ')' to close the value set"),
        ("app in ()", "for 'in', 'notin' operators, values set can't be empty"),
        ("app==a b", "found 'b', expected: ',' or 'end of string'"),
        ("n>x", "for '>', the value must be an integer"),
        ("-app", "invalid label key '-app'"),
    ],
)
def test_a_malformed_label_selector_says_what_the_api_server_says(selector: str, why: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse_label_selector(selector)
    assert str(caught.value) == f"unable to parse requirement: {why} in {selector!r}"


def test_field_selectors_split_on_unescaped_commas() -> None:
    assert parse_field_selector(r"status.phase=Running,metadata.name!=a\,b") == (
        FieldTerm("status.phase", "Running", True),
        FieldTerm("metadata.name", "a,b", False),
    )
    with pytest.raises(SelectorError, match="can't understand 'phase'"):
        parse_field_selector("phase")
