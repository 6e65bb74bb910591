"""What `serve` accepts but probably does not mean is named once at start, with a hint.

The router logging them as it starts is tests/process/test_cli_hints.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from headcount.cli.main import _parser
from headcount.cli.serve_flags import settings_from_args
from headcount.cli.serve_hints import serve_hints
from headcount.config import DiscoverySettings
from headcount.flags.parser import given_flags


def hints(*args: str) -> list[str]:
    ns = _parser().parse(["serve", *args])
    return serve_hints(settings_from_args(ns), given_flags(ns), ns.backends)


def test_a_clean_command_line_warns_nothing() -> None:
    assert hints("--backends", "http://127.0.0.1:8000,http://127.0.0.1:8001/") == []
    assert hints("--routing", "kv-aware", "--backends", "http://h:1", "--kv-events-port", "1") == []


def test_a_backend_written_as_an_openai_base_url_is_used_at_its_root() -> None:
    [hint] = hints("--backends", "http://127.0.0.1:8000,http://127.0.0.1:8001/v1/")
    assert hint.startswith("--backends http://127.0.0.1:8001/v1/: headcount adds /v1/")
    assert "using http://127.0.0.1:8001" in hint
    settings = DiscoverySettings(backends=("http://127.0.0.1:8001/v1/", "http://v1:80/api/v1"))
    assert settings.backends == ("http://127.0.0.1:8001", "http://v1:80/api")


def test_a_host_named_v1_is_not_a_path() -> None:
    assert hints("--backends", "http://v1") == []


def test_kubernetes_flags_with_static_discovery_are_named_as_ignored() -> None:
    [hint] = hints("--backends", "http://h:1", "--namespace", "llm", "--engine-port", "9000")
    assert hint == "--namespace, --engine-port: not used with --discovery static; ignored"


def test_kv_flags_without_kv_aware_routing_are_named_as_ignored() -> None:
    [hint] = hints("--backends", "http://h:1", "--routing", "session", "--tokenizer", "builtin")
    assert hint == "--tokenizer: not used with --routing session; ignored"


@pytest.mark.parametrize(("idle", "warned"), [("30s", True), ("60", False), ("90s", False)])
def test_a_watch_idle_timeout_under_the_bookmark_interval_is_named(idle: str, warned: bool) -> None:
    ns = _parser().parse(["serve", "--discovery", "k8s-pods", "--watch-idle-timeout", idle])
    found = serve_hints(settings_from_args(ns), given_flags(ns), ns.backends)
    assert bool(found) is warned
    if warned:
        assert "bookmark interval" in found[0]
        assert "relist every 30s" in found[0]


def test_flow_flags_without_a_tenants_file_are_named_as_ignored(tmp_path: Path) -> None:
    [hint] = hints("--backends", "http://h:1", "--max-queued", "10", "--limits-store-timeout", "1")
    assert hint == (
        "--max-queued, --limits-store-timeout: not used with flow control off "
        "(no --tenants-file); ignored"
    )
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("[default]\n")
    assert (
        hints("--backends", "http://h:1", "--tenants-file", str(tenants), "--max-queued", "9") == []
    )
