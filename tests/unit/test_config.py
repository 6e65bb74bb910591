"""Settings validate themselves, from the flags or built in code, with messages naming the flag."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from headcount.cli.serve_flags import add_serve_arguments, parse_duration, settings_from_args
from headcount.config import (
    BUILTIN_TOKENIZER,
    ConfigError,
    DiscoveryMode,
    DiscoverySettings,
    FlowSettings,
    HealthSettings,
    KvEventsSettings,
    ProbeSettings,
    ProxySettings,
    RoutingName,
    Settings,
)


def parse(*argv: str):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return settings_from_args(parser.parse_args(argv))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2", 2.0), ("0.5", 0.5), (".25", 0.25), ("250ms", 0.25), ("1.5s", 1.5), ("2m", 120.0)],
)
def test_durations_accept_fractional_seconds_and_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "-1", "1d", "1.2.3"])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_static_mode_needs_backends() -> None:
    with pytest.raises(ConfigError, match="--backends"):
        parse("--discovery", "static")


def test_backend_urls_must_be_http_host_port() -> None:
    with pytest.raises(ConfigError, match="ftp://x"):
        parse("--backends", "ftp://x")
    with pytest.raises(ConfigError, match=r"(?i)port out of range"):
        parse("--backends", "http://h:99999")


def test_full_command_line_builds_typed_settings() -> None:
    settings = parse(
        "--backends",
        "http://127.0.0.1:1/, http://127.0.0.1:2",
        "--routing",
        "least-loaded",
        "--connect-timeout",
        "0.5",
        "--max-body-size",
        "1MiB",
        "--discovery-stale-after",
        "1m",
    )
    assert settings.discovery.mode is DiscoveryMode.STATIC
    assert settings.discovery.backends == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert settings.proxy.routing is RoutingName.LEAST_LOADED
    assert settings.proxy.connect_timeout == 0.5
    assert settings.proxy.max_body_size == 1024 * 1024
    assert settings.health.discovery_stale_after == 60.0


def test_kubernetes_mode_rejects_backends_and_missing_kubeconfig(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="only applies"):
        parse("--discovery", "k8s-pods", "--backends", "http://a:1")
    with pytest.raises(ConfigError, match="no such file"):
        parse("--discovery", "k8s-pods", "--kubeconfig", str(tmp_path / "missing"))


def test_watch_timeout_bounds_are_ordered() -> None:
    with pytest.raises(ConfigError, match="watch-timeout-min"):
        parse("--discovery", "k8s-pods", "--watch-timeout-min", "10", "--watch-timeout-max", "5")


def test_liveness_bound_must_outlast_the_slowest_discovery_round() -> None:
    with pytest.raises(ConfigError, match="discovery-dead-after"):
        parse(
            "--discovery", "k8s-pods", "--discovery-dead-after", "100", "--watch-idle-timeout", "90"
        )
    settings = parse("--discovery", "k8s-pods", "--discovery-dead-after", "121")
    assert settings.health.discovery_dead_after == 121


STATIC = DiscoverySettings(backends=("http://127.0.0.1:1",))
PODS = DiscoveryMode.K8S_PODS


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: ProxySettings(max_failovers=-1), "--max-failovers must be 0 or more"),
        (lambda: ProxySettings(connect_timeout=0), "--connect-timeout must be positive"),
        (lambda: ProxySettings(read_timeout=-1), "--read-timeout must be positive"),
        (lambda: ProbeSettings(concurrency=0), "--probe-concurrency"),
        (lambda: ProbeSettings(unhealthy_after=0), "--unhealthy-after must be at least 1"),
        (lambda: ProbeSettings(interval=0), "--probe-interval must be positive"),
        (lambda: ProbeSettings(timeout=0), "--probe-timeout must be positive"),
        (lambda: DiscoverySettings(backends=("ftp://x",)), "ftp://x"),
        (lambda: DiscoverySettings(backends=("http://h:99999",)), "(?i)port out of range"),
        (lambda: DiscoverySettings(mode=PODS, backends=("http://a:1",)), "only applies"),
        (lambda: DiscoverySettings(kubeconfig=Path("/nonexistent/kubeconfig")), "no such file"),
        (
            lambda: DiscoverySettings(watch_timeout_min=10, watch_timeout_max=5),
            "--watch-timeout-min must not exceed --watch-timeout-max",
        ),
        (lambda: DiscoverySettings(watch_idle_timeout=0), "--watch-idle-timeout must be positive"),
        (lambda: Settings(), "--discovery static needs --backends"),
        (
            lambda: Settings(
                discovery=DiscoverySettings(mode=PODS, watch_idle_timeout=90),
                health=HealthSettings(discovery_dead_after=100),
            ),
            "--discovery-dead-after 100s must exceed --backoff-max",
        ),
    ],
)
def test_settings_built_in_code_are_validated_as_the_flags_are(
    build: Callable[[], object], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        build()


def test_the_liveness_bound_counts_the_api_request_timeout_when_it_is_the_longer_wait() -> None:
    slow_api = DiscoverySettings(mode=PODS, watch_idle_timeout=10, request_timeout=200)
    with pytest.raises(ConfigError, match=r"\(230s\)"):
        Settings(discovery=slow_api, health=HealthSettings(discovery_dead_after=230))
    settings = Settings(discovery=slow_api, health=HealthSettings(discovery_dead_after=231))
    assert settings.health.discovery_dead_after == 231


def test_a_changed_copy_is_validated_too() -> None:
    settings = Settings(discovery=STATIC)
    with pytest.raises(ConfigError, match="--discovery-dead-after"):
        dataclasses.replace(
            settings,
            discovery=DiscoverySettings(mode=PODS),
            health=HealthSettings(discovery_dead_after=60),
        )


def test_static_backends_are_kept_without_a_trailing_slash() -> None:
    settings = DiscoverySettings(backends=("http://127.0.0.1:1/", "http://127.0.0.1:2"))
    assert settings.backends == ("http://127.0.0.1:1", "http://127.0.0.1:2")


def test_every_default_is_valid_once_the_router_has_engines() -> None:
    settings = Settings(discovery=STATIC)
    assert settings.discovery.backends == ("http://127.0.0.1:1",)
    kubernetes = Settings(discovery=DiscoverySettings(mode=PODS))
    assert kubernetes.health.discovery_dead_after == HealthSettings().discovery_dead_after


def test_probe_answer_limits_come_from_the_flags_and_are_checked() -> None:
    settings = parse(
        "--backends", "http://127.0.0.1:1", "--probe-max-bytes", "2MiB", "--probe-max-models", "50"
    )
    assert (settings.probe.max_bytes, settings.probe.max_models) == (2 * 1024 * 1024, 50)
    with pytest.raises(ConfigError, match="--probe-max-bytes must be at least 1KiB"):
        ProbeSettings(max_bytes=100)
    with pytest.raises(ConfigError, match="--probe-max-models must be at least 1"):
        ProbeSettings(max_models=0)


def test_kv_event_flags_fill_the_kv_settings(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    settings = parse(
        "--backends",
        "http://127.0.0.1:1",
        "--routing",
        "kv-aware",
        "--kv-events-port",
        "6557",
        "--kv-events-replay-port",
        "6558",
        "--kv-events-topic",
        "kv",
        "--kv-events-idle-timeout",
        "30s",
        "--kv-events-check-interval",
        "5s",
        "--kv-events-replay-timeout",
        "500ms",
        "--kv-events-max-frame",
        "8MiB",
        "--kv-events-budget",
        "200000",
        "--tokenizer",
        str(tmp_path),
        "--tokenize-timeout",
        "250ms",
        "--kv-index-max-bytes",
        "2GiB",
        "--kv-index-max-bytes-per-engine",
        "128MiB",
        "--kv-placement",
        "on",
    )
    assert settings.proxy.routing is RoutingName.KV_AWARE
    assert settings.kv_events == KvEventsSettings(
        port=6557,
        replay_port=6558,
        topic="kv",
        idle_timeout=30.0,
        check_interval=5.0,
        replay_timeout=0.5,
        max_frame=8 * 1024 * 1024,
        budget=200_000,
        tokenizer=str(tmp_path),
        tokenize_timeout=0.25,
        index_max_bytes=2 << 30,
        index_max_bytes_per_engine=128 << 20,
        placement=True,
    )
    assert not parse("--backends", "http://127.0.0.1:1").kv_events.placement


def test_kv_event_flags_default_to_vllms_ports_and_the_engines_tokenize() -> None:
    settings = parse("--backends", "http://127.0.0.1:1")
    assert settings.kv_events == KvEventsSettings()
    assert (settings.kv_events.port, settings.kv_events.replay_port) == (5557, 5558)
    assert settings.kv_events.tokenizer is None
    assert parse("--backends", "http://a:1", "--tokenizer", "builtin").kv_events.tokenizer == (
        BUILTIN_TOKENIZER
    )


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: KvEventsSettings(port=0), "--kv-events-port 0: use 1-65535"),
        (lambda: KvEventsSettings(replay_port=70000), "--kv-events-replay-port 70000"),
        (lambda: KvEventsSettings(idle_timeout=0), "--kv-events-idle-timeout must be positive"),
        (lambda: KvEventsSettings(replay_timeout=-1), "--kv-events-replay-timeout must be"),
        (lambda: KvEventsSettings(check_interval=0), "--kv-events-check-interval must be"),
        (
            lambda: KvEventsSettings(idle_timeout=5, check_interval=3, replay_timeout=2),
            r"--kv-events-check-interval 3s plus --kv-events-replay-timeout 2s must be under "
            r"--kv-events-idle-timeout 5s",
        ),
        (lambda: KvEventsSettings(tokenize_timeout=0), "--tokenize-timeout must be positive"),
        (lambda: KvEventsSettings(max_frame=512), "--kv-events-max-frame 512: use at least 1KiB"),
        (lambda: KvEventsSettings(budget=0), "--kv-events-budget must be positive"),
        (lambda: KvEventsSettings(tokenizer="/nonexistent"), r"--tokenizer /nonexistent: no"),
        (lambda: KvEventsSettings(index_max_bytes=1000), "--kv-index-max-bytes 1000: use at"),
        (
            lambda: KvEventsSettings(index_max_bytes_per_engine=0),
            "--kv-index-max-bytes-per-engine 0: use at least 1MiB",
        ),
    ],
)
def test_kv_event_settings_are_checked(build: Callable[[], object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build()


def test_a_tokenizer_directory_needs_its_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        KvEventsSettings(tokenizer=str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert KvEventsSettings(tokenizer=str(tmp_path)).tokenizer == str(tmp_path)


def test_kv_flags_say_their_default_and_unit() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    text = parser.format_help()
    assert "kv-aware routing:" in text
    for flag, default in (
        ("--kv-events-port", "5557"),
        ("--kv-events-replay-port", "5558"),
        ("--kv-events-idle-timeout", "10s"),
        ("--kv-events-replay-timeout", "2s"),
        ("--tokenize-timeout", "1s"),
        ("--kv-index-max-bytes-per-engine", "64MiB"),
    ):
        help_text = " ".join(text.split(flag, 2)[-1].split("--")[0].split())
        assert f"default {default}" in help_text, flag
    assert "shared equally (default 1GiB)" in " ".join(text.split())


def test_flow_control_flags_fill_the_flow_settings() -> None:
    settings = parse(
        "--backends",
        "http://127.0.0.1:1",
        "--max-queued",
        "0",
        "--queue-timeout",
        "2m",
        "--limits-store",
        "redis://10.0.0.7:6380/2",
        "--limits-store-timeout",
        "250ms",
    )
    assert settings.flow == FlowSettings(
        max_queued=0,
        queue_timeout=120.0,
        limits_store="redis://10.0.0.7:6380/2",
        limits_store_timeout=0.25,
    )
    assert parse("--backends", "http://127.0.0.1:1").flow == FlowSettings()


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--max-queued", "-1", "--max-queued must be 0"),
        ("--queue-timeout", "0", "--queue-timeout must be positive"),
        ("--limits-store-timeout", "0ms", "--limits-store-timeout must be positive"),
        ("--limits-store", "http://redis:6379", "--limits-store http://redis:6379: expected redis"),
        ("--limits-store", "redis://:6379", "no host"),
        ("--limits-store", "redis://u:p@redis:6379", "no password in the URL"),
        ("--limits-store", "redis://redis:99999", "the port must be a number"),
        ("--limits-store", "redis://redis:6379/x", "the database must be a number"),
    ],
)
def test_flow_control_flags_are_checked_naming_the_flag(flag: str, value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=f"^{needle}" if needle.startswith("--") else needle):
        parse("--backends", "http://127.0.0.1:1", flag, value)


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-queued", "many"), ("--queue-timeout", "1d"), ("--limits-store-timeout", "fast")],
)
def test_flow_control_flags_of_the_wrong_kind_are_usage_errors(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("--backends", "http://127.0.0.1:1", flag, value)
    assert exited.value.code == 2
    assert f"argument {flag}: invalid" in capsys.readouterr().err


def test_flow_flags_say_their_default_and_unit() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "flow control: Read only with --tenants-file" in text
    for flag, default in (
        ("--max-queued", "(default 1000)"),
        ("--queue-timeout", "(default 30s)"),
        ("--limits-store", "(default: in this process, exact for one replica)"),
        ("--limits-store-timeout", "(default 0.1s)"),
    ):
        help_text = text.split(f"{flag} ", 2)[-1].split(" --")[0]
        assert default in help_text, (flag, help_text)


@pytest.mark.parametrize("selector", ["app in (a", "app in ()", "app=a b", "=vllm", "app>x"])
def test_a_label_selector_the_api_server_would_refuse_is_a_bad_flag(selector: str) -> None:
    with pytest.raises(ConfigError, match=r"^--label-selector '.*': unable to parse requirement"):
        DiscoverySettings(label_selector=selector)


@pytest.mark.parametrize("selector", ["", "app=", "app in (a,b),!tier", "m notin (x), app==v"])
def test_a_label_selector_the_api_server_accepts_is_accepted(selector: str) -> None:
    assert DiscoverySettings(label_selector=selector).label_selector == selector


def test_picker_flags_fill_the_server_settings(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("c")
    key.write_text("k")
    server = parse(
        "--backends=http://127.0.0.1:1",
        "--port=off",
        "--admin-port=9090",
        "--ext-proc-port=9002",
        f"--ext-proc-tls-cert={cert}",
        f"--ext-proc-tls-key={key}",
        "--ext-proc-fallbacks=2",
    ).server
    assert (server.port, server.admin_port, server.ext_proc_port) == (None, 9090, 9002)
    assert (server.ext_proc_tls_cert, server.ext_proc_tls_key) == (cert, key)
    assert server.ext_proc_fallbacks == 2
    default = parse("--backends=http://127.0.0.1:1").server
    assert (default.port, default.ext_proc_port, default.ext_proc_tls_cert) == (8080, None, None)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--port=off", "--admin-port=9090"], "--port off needs --ext-proc-port"),
        (["--port=off", "--ext-proc-port=9002"], "--port off needs --admin-port"),
        (["--ext-proc-port=8080"], "--ext-proc-port 8080 must differ"),
        (["--ext-proc-port=9002", "--ext-proc-tls-key=/k"], "go together"),
        (["--ext-proc-tls-cert=/c", "--ext-proc-tls-key=/k"], "needs --ext-proc-port"),
        (["--ext-proc-port=1", "--ext-proc-tls-cert=/c", "--ext-proc-tls-key=/k"], "no such file"),
        (["--ext-proc-port=9002", "--ext-proc-fallbacks=9"], "use 0-8"),
    ],
)
def test_picker_flags_are_checked_naming_the_flag(flags: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse("--backends", "http://127.0.0.1:1", *flags)
