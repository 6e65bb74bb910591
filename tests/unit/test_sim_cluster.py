"""The simulated-cluster harness itself: flags mean what they say, and the one wait.

Scenario tests, the demo and the benchmarks trust `headcount.sim.cluster` to
start the router they describe and to wait for what they expect; these tests
check that trust without starting a router: the command line is parsed by
`headcount serve`'s own parser. The client and the traffic against a scripted
router are tests/process/test_sim_cluster.py.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from headcount.cli.serve_flags import add_serve_arguments, settings_from_args
from headcount.config import (
    DiscoveryMode,
    HealthSettings,
    ProbeSettings,
    ProxySettings,
    RoutingName,
    Settings,
)
from headcount.sim.cluster import RouterFlags, Timings, serve_command, wait_until

__all__: list[str] = []

BACKENDS = ("http://127.0.0.1:8001", "http://127.0.0.2:8002")


def parsed(command: list[str]) -> Settings:
    """What `headcount serve` makes of `command`, by its own parser and validation."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return settings_from_args(parser.parse_args(command[command.index("serve") + 1 :]))


# ------------------------------------------------------------------ the command line


def test_every_timing_reaches_the_setting_its_flag_names() -> None:
    timings = Timings(
        probe_interval=0.25,
        probe_timeout=1.5,
        connect_timeout=0.3,
        backoff_initial=0.05,
        backoff_max=0.5,
        api_request_timeout=1,
        api_connect_timeout=0.4,
        watch_idle_timeout=2,
        discovery_stale_after=2.5,
        discovery_dead_after=7,
        drain_delay=0,
        drain_timeout=4,
        kv_events_idle_timeout=3,
        kv_events_check_interval=1.5,
        kv_events_replay_timeout=0.7,
        limits_store_timeout=0.15,
    )
    assert all(getattr(timings, f.name) is not None for f in dataclasses.fields(Timings)), (
        "a timing this test leaves unset is a flag nobody checked"
    )
    flags = RouterFlags(discovery=DiscoveryMode.STATIC, backends=BACKENDS, timings=timings)

    settings = parsed(serve_command(flags, host="127.0.0.1", port=8080))

    assert (settings.probe.interval, settings.probe.timeout) == (0.25, 1.5)
    assert settings.proxy.connect_timeout == 0.3
    discovery = settings.discovery
    assert (discovery.backoff_initial, discovery.backoff_max) == (0.05, 0.5)
    assert (discovery.request_timeout, discovery.connect_timeout) == (1, 0.4)
    assert discovery.watch_idle_timeout == 2
    health = settings.health
    assert (health.discovery_stale_after, health.discovery_dead_after) == (2.5, 7)
    assert (health.drain_delay, health.drain_timeout) == (0, 4)
    kv = settings.kv_events
    assert (kv.idle_timeout, kv.check_interval, kv.replay_timeout) == (3, 1.5, 0.7)
    assert settings.flow.limits_store_timeout == 0.15


def test_discovery_routing_and_health_flags_reach_their_settings(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}\n")
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("[default]\n")
    flags = RouterFlags(
        discovery=DiscoveryMode.K8S_PODS,
        kubeconfig=kubeconfig,
        namespace="llm",
        label_selector="app=engine,tier=gpu",
        engine_port=8123,
        routing=RoutingName.KV_AWARE,
        grpc_health_port=9123,
        ready_requires_fresh=True,
        tokenizer="builtin",
        kv_events_port=6557,
        kv_events_replay_port=6558,
        tenants_file=tenants,
        limits_store="redis://127.0.0.9:6380",
    )

    settings = parsed(serve_command(flags, host="127.0.0.3", port=8081))

    assert (settings.server.host, settings.server.port) == ("127.0.0.3", 8081)
    assert settings.server.grpc_health_port == 9123
    discovery = settings.discovery
    assert (discovery.mode, discovery.kubeconfig) == (DiscoveryMode.K8S_PODS, kubeconfig)
    assert (discovery.namespace, discovery.label_selector) == ("llm", "app=engine,tier=gpu")
    assert discovery.engine_port == 8123
    assert settings.proxy.routing is RoutingName.KV_AWARE
    assert settings.health.ready_requires_fresh
    kv = settings.kv_events
    assert (kv.tokenizer, kv.port, kv.replay_port) == ("builtin", 6557, 6558)
    assert settings.auth.tenants_file == tenants
    assert settings.flow.limits_store == "redis://127.0.0.9:6380"


def test_what_the_caller_leaves_out_keeps_the_routers_defaults() -> None:
    flags = RouterFlags(discovery=DiscoveryMode.STATIC, backends=BACKENDS)

    command = serve_command(flags, host="127.0.0.1", port=8080, program=("headcount",))
    settings = parsed(command)

    assert command[:2] == ["headcount", "serve"]
    assert settings.discovery.backends == BACKENDS
    assert settings.probe == ProbeSettings()
    assert settings.health == HealthSettings()
    assert settings.proxy.routing is ProxySettings().routing


# ------------------------------------------------------------------ waiting


async def test_wait_until_returns_the_first_truthy_value() -> None:
    values = iter([0, "", "there"])
    assert await wait_until(lambda: next(values), interval=0) == "there"


async def test_wait_until_awaits_a_condition_and_retries_when_it_raises() -> None:
    attempts: list[int] = []

    async def converging() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("not listening yet")
        return "up"

    assert await wait_until(converging, interval=0) == "up"
    assert len(attempts) == 3


async def test_a_wait_that_runs_out_names_what_it_awaited_and_the_last_error() -> None:
    async def refused() -> bool:
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(TimeoutError) as raised:
        await wait_until(refused, timeout=0.05, interval=0.01, what="the router")
    assert "waiting for the router" in str(raised.value)
    assert "ConnectionRefusedError('connection refused')" in str(raised.value)


async def test_a_plain_condition_that_raises_ends_the_wait_at_once() -> None:
    def broken() -> bool:
        raise KeyError("no such engine")

    with pytest.raises(KeyError):
        await wait_until(broken, timeout=60)
