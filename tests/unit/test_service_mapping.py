"""`service_to_spec`: a Service joined with its EndpointSlices (pure, no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from headcount.discovery.services import service_to_spec, unroutable_reason
from headcount.fleet import EngineSpec


def service(
    *,
    ports: list[dict[str, Any]] | None = None,
    cluster_ip: str = "10.96.0.10",
    kind: str = "ClusterIP",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "llama",
            "namespace": "llm",
            "uid": "svc-uid",
            "resourceVersion": "7",
            "labels": labels if labels is not None else {"model": "llama"},
            "annotations": annotations or {},
        },
        "spec": {
            "type": kind,
            "clusterIP": cluster_ip,
            "ports": ports if ports is not None else [{"name": "http", "port": 80}],
        },
    }


def endpoint_slice(*readiness: bool | None) -> dict[str, Any]:
    endpoints = []
    for ready in readiness:
        conditions = {} if ready is None else {"ready": ready}
        endpoints.append({"addresses": ["10.1.0.1"], "conditions": conditions})
    return {
        "metadata": {"name": "llama-abc", "labels": {"kubernetes.io/service-name": "llama"}},
        "endpoints": endpoints,
    }


def spec(
    svc: dict[str, Any], slices: list[dict[str, Any]], port: int | None = None
) -> EngineSpec | None:
    return service_to_spec(svc, slices, source="k8s-services", engine_port=port)


def test_a_service_with_a_ready_endpoint_is_a_ready_engine() -> None:
    assert spec(service(), [endpoint_slice(True)]) == EngineSpec(
        id="svc-uid",
        name="llm/llama",
        url="http://llama.llm:80",
        source="k8s-services",
        model_label="llama",
        sleeping=False,
        ready=True,
        lora_revision=None,
        object_ref="service/llm/llama",
        resource_version="7",
    )


@pytest.mark.parametrize(
    ("case", "slices", "ready"),
    [
        ("no slices at all", [], False),
        ("a slice without endpoints", [endpoint_slice()], False),
        ("every endpoint not ready", [endpoint_slice(False, False)], False),
        ("one of several ready", [endpoint_slice(False, True)], True),
        ("nil ready counts as ready", [endpoint_slice(None)], True),
        ("ready in the second slice", [endpoint_slice(False), endpoint_slice(True)], True),
        ("not ready in every slice", [endpoint_slice(False), endpoint_slice(False)], False),
    ],
)
def test_readiness_comes_from_the_endpoint_slices(
    case: str, slices: list[dict[str, Any]], ready: bool
) -> None:
    engine = spec(service(), slices)
    assert engine is not None and engine.ready is ready, case


@pytest.mark.parametrize(
    ("case", "svc"),
    [
        ("headless", service(cluster_ip="None")),
        ("ExternalName", service(kind="ExternalName", cluster_ip="")),
        ("no ports", service(ports=[])),
    ],
)
def test_a_service_without_one_address_is_no_engine(case: str, svc: dict[str, Any]) -> None:
    assert spec(svc, [endpoint_slice(True)]) is None, case
    assert unroutable_reason(svc), case


def test_a_routable_service_has_no_unroutable_reason() -> None:
    assert unroutable_reason(service()) is None


@pytest.mark.parametrize(
    ("ports", "engine_port", "expected"),
    [
        ([{"name": "metrics", "port": 9090}, {"name": "http", "port": 80}], None, 80),
        ([{"name": "metrics", "port": 9090}, {"name": "grpc", "port": 50051}], None, 9090),
        ([{"name": "http", "port": 80}, {"name": "api", "port": 8000}], 8000, 8000),
        ([{"name": "http", "port": 80}], 8000, 80),
        ([{"port": 8080}], None, 8080),
    ],
)
def test_the_port_is_the_engine_port_else_http_else_the_first(
    ports: list[dict[str, Any]], engine_port: int | None, expected: int
) -> None:
    engine = spec(service(ports=ports), [endpoint_slice(True)], port=engine_port)
    assert engine is not None and engine.url == f"http://llama.llm:{expected}"


def test_service_metadata_carries_sleeping_and_lora_revision() -> None:
    svc = service(
        labels={"model": "llama", "sleeping": "true"}, annotations={"lora-modified": "r2"}
    )
    engine = spec(svc, [endpoint_slice(True)])
    assert engine is not None and engine.sleeping and engine.lora_revision == "r2"


def test_service_annotations_say_where_the_engine_publishes_kv_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    svc = service(annotations={"kv-events-port": "6557", "kv-events-replay-port": "6558"})
    engine = spec(svc, [endpoint_slice(True)])
    assert engine is not None
    assert (engine.kv_events_port, engine.kv_events_replay_port) == (6557, 6558)
    svc = service(annotations={"kv-events-port": "6557", "kv-events-replay-port": "replay"})
    engine = spec(svc, [endpoint_slice(True)])
    assert engine is not None and engine.ready
    assert (engine.kv_events_port, engine.kv_events_replay_port) == (6557, None)
    assert any("kv-events-replay-port='replay'" in r.getMessage() for r in caplog.records)


def test_a_malformed_service_raises_so_the_caller_can_isolate_it() -> None:
    svc = service(ports=[{"name": "http", "port": "eighty"}])
    with pytest.raises(ValueError):
        spec(svc, [])
