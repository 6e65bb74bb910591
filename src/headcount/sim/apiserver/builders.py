"""Pods, Services, EndpointSlices and InferencePools as a cluster reports them, for tests to apply.

Discovery reads what a cluster's controllers write (a scheduled pod's
conditions and IPs, an EndpointSlice's endpoint conditions), so the builders
fill those in as the real ones would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from headcount.sim.apiserver.objects import JsonObject, timestamp

__all__ = ["make_endpointslice", "make_inference_pool", "make_pod", "make_service"]


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    ip: str | None = "127.0.0.1",
    ready: bool = True,
    phase: str = "Running",
    port: int = 8000,
    node: str = "sim-node",
) -> JsonObject:
    """A Pod as a running cluster reports it: scheduled, one container, the Ready condition."""
    now = timestamp()
    state: JsonObject = (
        {"running": {"startedAt": now}}
        if phase == "Running"
        else {"waiting": {"reason": "ContainerCreating"}}
    )
    condition = "True" if ready else "False"
    status: JsonObject = {
        "phase": phase,
        "hostIP": "10.0.0.1",
        "startTime": now,
        "conditions": [
            {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": now}
            for kind, value in (
                ("Initialized", "True"),
                ("Ready", condition),
                ("ContainersReady", condition),
                ("PodScheduled", "True"),
            )
        ],
        "containerStatuses": [
            {
                "name": "engine",
                "image": "vllm/vllm-openai:latest",
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "started": phase == "Running",
                "state": state,
            }
        ],
    }
    if ip is not None:
        status.update(podIP=ip, podIPs=[{"ip": ip}])
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "containers": [
                {
                    "name": "engine",
                    "image": "vllm/vllm-openai:latest",
                    "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
                }
            ],
        },
        "status": status,
    }


def make_service(
    name: str,
    *,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    selector: Mapping[str, str] | None = None,
    ports: Sequence[int] = (8000,),
    cluster_ip: str = "10.96.0.10",
    type: str = "ClusterIP",
) -> JsonObject:
    """A Service; `selector` defaults to `labels`. Ports are named "http", then "http-PORT"."""
    return {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "type": type,
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "selector": dict(selector if selector is not None else labels or {}),
            "ports": [
                {
                    "name": "http" if i == 0 else f"http-{port}",
                    "port": port,
                    "targetPort": port,
                    "protocol": "TCP",
                }
                for i, port in enumerate(ports)
            ],
        },
    }


def make_endpointslice(
    service_name: str,
    endpoints: Sequence[tuple[str, bool]] = (),
    port: int = 8000,
    *,
    namespace: str = "default",
    name: str | None = None,
    port_name: str = "http",
) -> JsonObject:
    """An EndpointSlice of a Service: one endpoint per ``(ip, ready)``, one port.

    Named ``{service_name}-slice`` unless `name` says otherwise, so applying it
    again replaces it.
    """
    ipv6 = any(":" in ip for ip, _ in endpoints)
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name or f"{service_name}-slice",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service_name,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv6" if ipv6 else "IPv4",
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
            }
            for ip, ready in endpoints
        ],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


def make_inference_pool(
    name: str,
    *,
    namespace: str = "default",
    match_labels: Mapping[str, str],
    ports: Sequence[int] = (8000,),
    endpoint_picker: str | None = None,
) -> JsonObject:
    """An InferencePool (inference.networking.k8s.io/v1) selecting pods by `match_labels` on
    `ports`; `endpoint_picker` names the Service of its picker (port 9002, GIE's default)."""
    spec: JsonObject = {
        "selector": {"matchLabels": dict(match_labels)},
        "targetPorts": [{"number": port} for port in ports],
    }
    if endpoint_picker is not None:
        spec["endpointPickerRef"] = {"name": endpoint_picker, "port": {"number": 9002}}
    return {
        "kind": "InferencePool",
        "apiVersion": "inference.networking.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
