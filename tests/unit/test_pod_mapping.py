"""`pod_to_spec`: which pods are engines, why the others are not, and what the fleet reads
from them (pure, no I/O)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from headcount.discovery.pods import pod_engine, pod_to_spec, why_not_an_engine
from headcount.fleet import EngineSpec


def pod(
    *,
    ip: str | None = "10.1.2.3",
    phase: str = "Running",
    ready: str | None = "True",
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if ip is not None:
        status["podIP"] = ip
    if ready is not None:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": ready},
        ]
    metadata: dict[str, Any] = {
        "name": "engine-0",
        "namespace": "llm",
        "uid": "uid-0",
        "resourceVersion": "42",
        "labels": labels if labels is not None else {"model": "llama"},
        "annotations": annotations or {},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"metadata": metadata, "status": status}


def spec(p: dict[str, Any], port: int = 8000) -> EngineSpec | None:
    return pod_to_spec(p, source="k8s-pods", engine_port=port)


def test_a_running_ready_pod_with_an_ip_is_an_engine() -> None:
    assert spec(pod()) == EngineSpec(
        id="uid-0",
        name="llm/engine-0",
        url="http://10.1.2.3:8000",
        source="k8s-pods",
        model_label="llama",
        sleeping=False,
        ready=True,
        lora_revision=None,
        object_ref="pod/llm/engine-0",
        resource_version="42",
    )


@pytest.mark.parametrize(
    ("case", "the_pod", "reason"),
    [
        ("no IP yet", pod(ip=None), "no IP"),
        ("empty IP", pod(ip=""), "no IP"),
        ("Pending", pod(phase="Pending", ip=None), "pending"),
        ("Succeeded", pod(phase="Succeeded"), "succeeded"),
        ("Failed", pod(phase="Failed"), "failed"),
        ("an unknown phase", pod(phase="Unknown"), "not running"),
        ("Ready=False", pod(ready="False"), "not ready"),
        ("Ready=Unknown", pod(ready="Unknown"), "not ready"),
        ("no Ready condition", pod(ready=None), "not ready"),
        ("being deleted", pod(deleting=True), "terminating"),
        ("no status at all", {"metadata": pod()["metadata"]}, "pending"),
    ],
)
def test_a_pod_that_cannot_serve_is_not_an_engine_and_says_why(
    case: str, the_pod: dict[str, Any], reason: str
) -> None:
    assert spec(the_pod) is None, case
    assert why_not_an_engine(the_pod) == reason, case
    assert pod_engine(the_pod, source="k8s-pods", engine_port=8000) == reason, case


def test_an_engine_pod_has_no_reason_not_to_be_one() -> None:
    assert why_not_an_engine(pod()) is None
    assert pod_engine(pod(), source="k8s-pods", engine_port=8000) == spec(pod())


def test_an_ipv6_pod_gets_a_bracketed_url() -> None:
    engine = spec(pod(ip="fd00::1:2"), port=9000)
    assert engine is not None and engine.url == "http://[fd00::1:2]:9000"


def test_the_engine_port_comes_from_the_settings() -> None:
    engine = spec(pod(), port=8123)
    assert engine is not None and engine.url == "http://10.1.2.3:8123"


@pytest.mark.parametrize(("label", "sleeping"), [("true", True), ("false", False), (None, False)])
def test_the_sleeping_label_marks_an_engine_asleep(label: str | None, sleeping: bool) -> None:
    labels = {"model": "llama"} | ({"sleeping": label} if label is not None else {})
    engine = spec(pod(labels=labels))
    assert engine is not None and engine.sleeping is sleeping


def test_the_lora_modified_annotation_is_the_adapter_revision() -> None:
    engine = spec(pod(annotations={"lora-modified": "2024-05-01T10:00:00Z"}))
    assert engine is not None and engine.lora_revision == "2024-05-01T10:00:00Z"


def test_the_kv_event_annotations_say_where_the_engine_publishes() -> None:
    engine = spec(pod(annotations={"kv-events-port": "6557", "kv-events-replay-port": " 6558"}))
    assert engine is not None
    assert (engine.kv_events_port, engine.kv_events_replay_port) == (6557, 6558)
    plain = spec(pod())
    assert plain is not None
    assert (plain.kv_events_port, plain.kv_events_replay_port) == (None, None)


@pytest.mark.parametrize("value", ["http", "0", "65536", "-1", "5557x", ""])
def test_a_malformed_kv_event_annotation_is_ignored_with_one_warning(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    annotated = pod(annotations={"kv-events-port": value, "kv-events-replay-port": "7000"})
    for _ in range(3):
        engine = spec(annotated)
        assert engine is not None and engine.ready
        assert (engine.kv_events_port, engine.kv_events_replay_port) == (None, 7000)
    warnings = [r for r in caplog.records if "kv-events-port" in r.getMessage()]
    assert len(warnings) == 1
    assert "pod/llm/engine-0" in warnings[0].getMessage()


def test_a_pod_without_labels_has_no_model_label() -> None:
    bare = pod()
    del bare["metadata"]["labels"]
    engine = spec(bare)
    assert engine is not None and engine.model_label is None and not engine.sleeping


def test_identity_is_the_uid_not_the_ip() -> None:
    first, second = pod(), pod()
    second["metadata"]["uid"] = "uid-1"
    a, b = spec(first), spec(second)
    assert a is not None and b is not None
    assert a.url == b.url and a.id != b.id


def test_readiness_transitions_in_both_directions() -> None:
    """Pending -> Running not ready -> ready -> terminating: an engine only while ready."""
    states = [
        pod(phase="Pending", ip=None, ready=None),
        pod(ready="False"),
        pod(),
        pod(deleting=True),
    ]
    assert [spec(s) is not None for s in states] == [False, False, True, False]


@pytest.mark.parametrize(
    ("case", "mutate"),
    [
        ("IP is not an address", lambda p: p["status"].update(podIP="not-an-ip")),
        ("conditions is a string", lambda p: p["status"].update(conditions="Ready")),
        ("status is a list", lambda p: p.update(status=["Running"])),
        ("no uid", lambda p: p["metadata"].pop("uid")),
        ("labels is a list", lambda p: p["metadata"].update(labels=["model"])),
    ],
)
def test_a_malformed_pod_raises_so_the_caller_can_isolate_it(case: str, mutate: Any) -> None:
    broken = copy.deepcopy(pod())
    mutate(broken)
    with pytest.raises((TypeError, ValueError, KeyError, AttributeError)):
        spec(broken)
