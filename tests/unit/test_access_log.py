"""The access log on its own: which requests get a line (pure: a countdown), and its text.

The lines' contents through the proxy are tests/process/test_access_log.py.
"""

from __future__ import annotations

import logging

import pytest

from headcount.config import ConfigError, ProxySettings
from headcount.surfaces.access_log import AccessEntry, AccessLog

__all__: list[str] = []


def entry(**changes: object) -> AccessEntry:
    fields: dict[str, object] = {
        "request_id": b"r-1",
        "method": b"POST",
        "path": b"/v1/chat/completions",
        "model": "m",
        "engine": "e",
        "status": 200,
        "outcome": "ok",
        "ttfb": 0.0123,
        "duration": 0.5,
        "bytes_in": 10,
        "bytes_out": 20,
        "failovers": 0,
        "cut": False,
        "cached_tokens": None,
        "resumed_from": None,
    }
    return AccessEntry(**{**fields, **changes})  # type: ignore[arg-type]


def on_logger() -> logging.Logger:
    logger = logging.getLogger("headcount.access.test-on")
    logger.setLevel(logging.INFO)
    return logger


# -- sampling (pure) ----------------------------------------------------------------------------


def test_one_answer_in_n_is_drawn_for_a_line() -> None:
    log = AccessLog(0.25, on_logger())
    assert [log.draw() for _ in range(8)] == [False, False, False, True] * 2


def test_every_chosen_request_gets_a_line_whatever_the_rate() -> None:
    log = AccessLog(0.001, on_logger())
    assert all(log.wants(chosen=True) for _ in range(5))
    assert not log.wants(chosen=False)


def test_rate_zero_turns_the_log_off_and_one_logs_everything() -> None:
    off, every = AccessLog(0, on_logger()), AccessLog(1, on_logger())
    assert not any(off.draw() for _ in range(3)) and not off.wants(chosen=True)
    assert all(every.draw() for _ in range(5))


def test_nothing_is_wanted_when_the_logger_is_off() -> None:
    logger = logging.getLogger("headcount.access.test-off")
    logger.setLevel(logging.WARNING)
    log = AccessLog(1, logger)
    assert not log.wants(chosen=True)


def test_a_rate_outside_0_to_1_is_refused() -> None:
    for rate in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="--access-log-sample"):
            ProxySettings(access_log_sample=rate)


def test_the_text_is_logfmt_and_client_text_cannot_forge_a_field() -> None:
    text = str(entry(model='m" status=500\nx', cached_tokens=7))
    assert text.startswith("request_id=r-1 method=POST path=/v1/chat/completions ")
    assert 'model="m\\" status=500\\nx" engine=e status=200 outcome=ok' in text
    assert "ttfb_ms=12.3 duration_ms=500.0 bytes_in=10 bytes_out=20 failovers=0" in text
    assert text.endswith(
        "cut=false cached_tokens=7 resumed_from=- tried=- tenant=- prompt_tokens=- "
        "completion_tokens=-"
    )
    assert "\n" not in text
