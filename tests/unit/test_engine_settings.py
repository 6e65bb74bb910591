"""The settings for broken engines: first-byte timeout, stalls, DNS lookups, outlier detection."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from headcount.cli.serve_flags import add_serve_arguments, settings_from_args
from headcount.config import (
    ConfigError,
    DiscoverySettings,
    DnsSettings,
    OutlierSettings,
    ProbeSettings,
    ProxySettings,
    Settings,
)

__all__: list[str] = []

BACKENDS = ("--backends", "http://127.0.0.1:1")


def parse(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return settings_from_args(parser.parse_args([*BACKENDS, *argv]))


def test_by_default_detection_is_on_and_the_first_byte_is_waited_for() -> None:
    settings = parse()
    assert settings.proxy.first_byte_timeout is None
    assert settings.proxy.stalled_engine_timeout == 30.0
    assert settings.outlier == OutlierSettings(
        consecutive_errors=5, base_ejection=30.0, max_ejection=300.0, max_ejected_percent=50.0
    )
    assert settings.dns.timeout < settings.probe.timeout


def test_the_flags_reach_the_settings() -> None:
    settings = parse(
        "--first-byte-timeout",
        "1.5s",
        "--stalled-engine-timeout",
        "0",
        "--dns-timeout",
        "250ms",
        "--outlier-consecutive-errors",
        "0",
        "--outlier-base-ejection",
        "10",
        "--outlier-max-ejection",
        "2m",
        "--outlier-max-ejected-percent",
        "33.3",
    )
    assert settings.proxy.first_byte_timeout == 1.5
    assert settings.proxy.stalled_engine_timeout == 0.0
    assert settings.dns == DnsSettings(timeout=0.25)
    assert settings.outlier == OutlierSettings(
        consecutive_errors=0, base_ejection=10.0, max_ejection=120.0, max_ejected_percent=33.3
    )


STATIC = DiscoverySettings(backends=("http://127.0.0.1:1",))


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: ProxySettings(first_byte_timeout=0), "--first-byte-timeout must be positive"),
        (lambda: ProxySettings(stalled_engine_timeout=-1), "--stalled-engine-timeout must be 0"),
        (lambda: DnsSettings(timeout=0), "--dns-timeout must be positive"),
        (lambda: OutlierSettings(consecutive_errors=-1), "--outlier-consecutive-errors"),
        (lambda: OutlierSettings(base_ejection=0), "--outlier-base-ejection must be positive"),
        (
            lambda: OutlierSettings(base_ejection=60, max_ejection=30),
            "--outlier-max-ejection must not be under --outlier-base-ejection",
        ),
        (lambda: OutlierSettings(max_ejected_percent=101), "--outlier-max-ejected-percent"),
        (lambda: OutlierSettings(max_ejected_percent=-1), "--outlier-max-ejected-percent"),
        (
            lambda: Settings(
                discovery=STATIC, probe=ProbeSettings(timeout=0.5), dns=DnsSettings(timeout=0.5)
            ),
            "--dns-timeout 0.5s must be under --probe-timeout 0.5s",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_flag(build: Callable[[], object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build()
