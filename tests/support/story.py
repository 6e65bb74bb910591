"""The fleet's story as tests read it: the lines `headcount.fleet` logs, level and text.

`story` is a fixture (tests/conftest.py offers it to every test): the log
captured at INFO and above; `lines` takes what the fleet told since the last
call.
"""

from __future__ import annotations

import logging

import pytest

__all__ = ["lines", "story"]


@pytest.fixture
def story(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The lines logged at INFO and above."""
    caplog.set_level(logging.INFO, logger="headcount")
    return caplog


def lines(story: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The fleet's lines since the last call."""
    told = [(r.levelno, r.getMessage()) for r in story.records if r.name == "headcount.fleet"]
    story.clear()
    return told
