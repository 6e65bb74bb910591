"""What the routing suite measures: headcount's policies, the peers' and the oracle."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common.harness import HEADCOUNT_BIN
from bench.common.peers import SGLANG_ROUTER, VLLM_ROUTER, sglang_router, vllm_router
from bench.routing.fleet import MODEL, Engine
from headcount.config import DiscoveryMode, RoutingName
from headcount.sim.cluster import RouterFlags, serve_command

__all__ = ["ORACLE", "TARGETS", "Target"]

ORACLE = "bench.routing.programs.oracle"
"""Run as `python -m`, a process of its own, so its CPU is counted as a router's."""


@dataclass(frozen=True)
class Target:
    """A router to measure: `command` starts it given its port, metrics port and the engines."""

    name: str
    program: Path
    command: Callable[[int, int, Sequence[Engine]], list[str]]
    peer: bool = False
    behind_envoy: bool = False
    """Clients reach it through Envoy (deploy/gateway/envoy.yaml, FULL_DUPLEX_STREAMED):
    `command` then gets the endpoint picker's ext_proc port and its admin port."""


def _headcount(
    policy: RoutingName, tokenizer: str | None, port: int, _: int, engines: Sequence[Engine]
) -> list[str]:
    kv_aware = policy is RoutingName.KV_AWARE
    flags = RouterFlags(
        discovery=DiscoveryMode.STATIC,
        backends=tuple(engine.url for engine in engines),
        routing=policy,
        tokenizer=tokenizer,
        kv_events_port=engines[0].events_port if kv_aware else None,
        kv_events_replay_port=engines[0].replay_port if kv_aware else None,
    )
    return serve_command(flags, host="127.0.0.1", port=port, program=(str(HEADCOUNT_BIN),))


def _placed(tokenizer: str | None, port: int, metrics: int, engines: Sequence[Engine]) -> list[str]:
    """kv-aware with its capacity-aware placement plan (`--kv-placement on`)."""
    own = _headcount(RoutingName.KV_AWARE, tokenizer, port, metrics, engines)
    return [*own, "--kv-placement=on"]


def _picker(
    policy: RoutingName, tokenizer: str | None, picker: int, admin: int, engines: Sequence[Engine]
) -> list[str]:
    """headcount as Envoy's endpoint picker only (`--port off`), as `_headcount` routes."""
    own = _headcount(policy, tokenizer, picker, admin, engines)
    return [*own, "--port=off", f"--ext-proc-port={picker}", f"--admin-port={admin}"]


def _urls(engines: Sequence[Engine]) -> list[str]:
    return [engine.url for engine in engines]


def _vllm_router(policy: str, port: int, metrics: int, engines: Sequence[Engine]) -> list[str]:
    argv = vllm_router(port, metrics, _urls(engines), policy)
    if policy == "kv_aware":
        for engine in engines:
            argv += ["--kv-event-source", f"{engine.url}=tcp://{engine.host}:{engine.events_port}"]
            argv += [
                "--kv-event-replay-source",
                f"{engine.url}=tcp://{engine.host}:{engine.replay_port}",
            ]
        argv += ["--kv-event-model", MODEL]
    return argv


def _sglang_router(policy: str, port: int, metrics: int, engines: Sequence[Engine]) -> list[str]:
    return sglang_router(port, metrics, _urls(engines), policy)


def _oracle(port: int, _: int, engines: Sequence[Engine]) -> list[str]:
    urls = ",".join(_urls(engines))
    return [sys.executable, "-m", ORACLE, "--port", str(port), "--engines", urls]


def _hc(policy: RoutingName, tokenizer: str | None = None, suffix: str = "") -> Target:
    return Target(
        f"headcount {policy.value}{suffix}",
        HEADCOUNT_BIN,
        functools.partial(_headcount, policy, tokenizer),
    )


def _peer(name: str, program: Path, command: Callable[..., list[str]], policy: str) -> Target:
    return Target(f"{name} {policy}", program, functools.partial(command, policy), peer=True)


TARGETS: tuple[Target, ...] = (
    _hc(RoutingName.ROUND_ROBIN),
    _hc(RoutingName.LEAST_LOADED),
    _hc(RoutingName.PREFIX),
    _hc(RoutingName.KV_AWARE, "builtin"),
    _hc(RoutingName.KV_AWARE, None, " /tokenize"),
    Target("headcount kv-aware placement", HEADCOUNT_BIN, functools.partial(_placed, "builtin")),
    Target(
        "envoy+headcount kv-aware",
        HEADCOUNT_BIN,
        functools.partial(_picker, RoutingName.KV_AWARE, "builtin"),
        behind_envoy=True,
    ),
    _peer("vllm-router", VLLM_ROUTER, _vllm_router, "cache_aware"),
    _peer("vllm-router", VLLM_ROUTER, _vllm_router, "kv_aware"),
    _peer("vllm-router", VLLM_ROUTER, _vllm_router, "round_robin"),
    _peer("sglang-router", SGLANG_ROUTER, _sglang_router, "cache_aware"),
    _peer("sglang-router", SGLANG_ROUTER, _sglang_router, "round_robin"),
    Target("oracle", Path(sys.executable), _oracle),
)
