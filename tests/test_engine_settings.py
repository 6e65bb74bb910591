"""The settings for broken engines: the first-byte timeout, DNS lookups."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from headcount.config import (
    ConfigError,
    DiscoverySettings,
    DnsSettings,
    ProbeSettings,
    ProxySettings,
    Settings,
    add_serve_arguments,
    settings_from_args,
)

__all__: list[str] = []

BACKENDS = ("--backends", "http://127.0.0.1:1")


def parse(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return settings_from_args(parser.parse_args([*BACKENDS, *argv]))


def test_the_first_byte_is_waited_for_unless_a_timeout_is_set() -> None:
    assert parse().proxy.first_byte_timeout is None
    assert parse("--first-byte-timeout", "1.5s").proxy.first_byte_timeout == 1.5


def test_the_lookup_timeout_is_under_the_probe_timeout_and_set_by_its_flag() -> None:
    assert parse().dns.timeout < parse().probe.timeout
    assert parse("--dns-timeout", "250ms").dns == DnsSettings(timeout=0.25)


STATIC = DiscoverySettings(backends=("http://127.0.0.1:1",))


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: ProxySettings(first_byte_timeout=0), "--first-byte-timeout must be positive"),
        (lambda: DnsSettings(timeout=0), "--dns-timeout must be positive"),
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
