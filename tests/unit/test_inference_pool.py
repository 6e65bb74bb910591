"""An InferencePool read as its CRD says (`pool_target`) and its pods mapped to engines, one per
target port (`pool_engines`); the flags that ask for it (pure, no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from headcount.cli.main import _parser
from headcount.cli.serve_flags import settings_from_args
from headcount.cli.serve_hints import serve_hints
from headcount.config import ConfigError, DiscoveryMode, DiscoverySettings
from headcount.discovery.inference_pool import engine_ids, pool_engines
from headcount.flags.parser import given_flags
from headcount.pool_spec import PoolTarget, pool_target


def pool(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "namespace": "llm"}, "spec": spec}


def pod(*, ready: str = "True", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "vllm-0",
            "namespace": "llm",
            "uid": "uid-0",
            "resourceVersion": "42",
            "labels": labels if labels is not None else {"app": "vllm", "model": "llama"},
        },
        "status": {
            "phase": "Running",
            "podIP": "10.1.2.3",
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


SPEC = {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]}


def test_a_pool_gives_its_selector_and_ports_in_order() -> None:
    target = pool_target(
        pool(
            {
                "selector": {"matchLabels": {"model": "llama", "app": "vllm"}},
                "targetPorts": [{"number": 8001}, {"number": 8000}],
                "endpointPickerRef": {"name": "headcount", "port": {"number": 9002}},
            }
        )
    )
    assert target == PoolTarget((("app", "vllm"), ("model", "llama")), (8001, 8000))
    assert target.selector == "app=vllm,model=llama"
    assert target.selects({"app": "vllm", "model": "llama", "other": "x"})
    assert not target.selects({"app": "vllm"})


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ({"targetPorts": [{"number": 8000}]}, "matchLabels: Required value"),
        ({**SPEC, "selector": {"matchLabels": {}}}, "matchLabels: Required value"),
        ({**SPEC, "selector": {"matchLabels": {"app": "a b"}}}, "Invalid value: app=a b"),
        ({**SPEC, "selector": {"matchLabels": {"app": 1}}}, "Invalid value: app=1"),
        ({"selector": SPEC["selector"]}, "1 to 8 ports"),
        ({**SPEC, "targetPorts": []}, "1 to 8 ports"),
        ({**SPEC, "targetPorts": [{"number": n} for n in range(1, 10)]}, "1 to 8 ports"),
        ({**SPEC, "targetPorts": [{"number": 0}]}, "number 0 is not a port"),
        ({**SPEC, "targetPorts": [{"number": 65536}]}, "number 65536 is not a port"),
        ({**SPEC, "targetPorts": [{"number": "8000"}]}, "number '8000' is not a port"),
        ({**SPEC, "targetPorts": [{}]}, "number None is not a port"),
        ({**SPEC, "targetPorts": [{"number": 1}, {"number": 1}]}, "must be unique"),
    ],
)
def test_a_pool_the_crd_would_refuse_is_refused(spec: dict[str, Any], refused: str) -> None:
    with pytest.raises(ValueError, match=refused):
        pool_target(pool(spec))


def test_a_ready_pod_is_one_engine_per_target_port_named_by_rank() -> None:
    target = PoolTarget((("app", "vllm"),), (8000, 8001))
    engines = pool_engines(pod(), target, source="inference-pool")
    assert isinstance(engines, list)
    assert [(e.id, e.name, e.url) for e in engines] == [
        ("uid-0:8000", "llm/vllm-0-rank-0", "http://10.1.2.3:8000"),
        ("uid-0:8001", "llm/vllm-0-rank-1", "http://10.1.2.3:8001"),
    ]
    assert {(e.source, e.model_label, e.object_ref) for e in engines} == {
        ("inference-pool", "llama", "pod/llm/vllm-0")
    }
    assert [e.id for e in engines] == engine_ids("uid-0", target)


def test_a_port_changed_is_another_engine() -> None:
    before = pool_engines(pod(), PoolTarget((("app", "vllm"),), (8000,)), source="p")
    after = pool_engines(pod(), PoolTarget((("app", "vllm"),), (8001,)), source="p")
    assert isinstance(before, list) and isinstance(after, list)
    assert before[0].id != after[0].id
    assert before[0].name == after[0].name == "llm/vllm-0-rank-0"


def test_a_pod_that_is_no_engine_says_why_for_all_its_ports() -> None:
    target = PoolTarget((("app", "vllm"),), (8000, 8001))
    assert pool_engines(pod(ready="False"), target, source="p") == "not ready"


def parse(*args: str) -> DiscoverySettings:
    return settings_from_args(_parser().parse(["serve", *args])).discovery


def test_the_inference_pool_mode_names_its_pool() -> None:
    settings = parse("--discovery", "inference-pool", "--inference-pool", "vllm-llama")
    assert (settings.mode, settings.inference_pool) == (DiscoveryMode.INFERENCE_POOL, "vllm-llama")


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["--discovery", "inference-pool"], "needs --inference-pool NAME"),
        (["--discovery", "inference-pool", "--inference-pool", "Bad_Name"], "not a Kubernetes"),
        (["--discovery", "k8s-pods", "--inference-pool", "p"], "only applies to --discovery"),
        (["--backends", "http://h:1", "--inference-pool", "p"], "only applies to --discovery"),
    ],
)
def test_a_pool_flag_that_cannot_work_is_refused(args: list[str], refused: str) -> None:
    with pytest.raises(ConfigError, match=refused):
        parse(*args)


def test_the_engine_port_is_named_as_ignored_with_an_inference_pool() -> None:
    args = ["serve", "--discovery", "inference-pool", "--inference-pool", "p"]
    ns = _parser().parse([*args, "--engine-port", "9000", "--watch-idle-timeout", "90s"])
    assert serve_hints(settings_from_args(ns), given_flags(ns), ns.backends) == [
        "--engine-port: not used with --discovery inference-pool (the pool's targetPorts are "
        "the ports); ignored"
    ]
