"""Real Kubernetes clients against the emulator: what they accept, the real server would send.

The official (sync) client runs in a worker thread so the emulator's loop keeps
serving; kubernetes_asyncio (what headcount uses) and kubectl run beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_asyncio
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from headcount.sim.apiserver import (
    ApiServerSim,
    ApiServerSimConfig,
    make_endpointslice,
    make_inference_pool,
    make_pod,
    running_apiserver,
)
from tests.support import wait_until

BOOKMARK_INTERVAL = 0.3
REQUEST_TIMEOUT = 10
KUBECTL = os.environ.get("HEADCOUNT_KUBECTL", "")


@pytest.fixture
async def sim() -> AsyncIterator[ApiServerSim]:
    async with running_apiserver(ApiServerSimConfig(bookmark_interval=BOOKMARK_INTERVAL)) as server:
        yield server


@pytest.fixture
def kubeconfig(sim: ApiServerSim, tmp_path: Path) -> Path:
    return sim.kubeconfig(tmp_path / "kubeconfig")


def official_client(kubeconfig: Path) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(
        config_file=str(kubeconfig), persist_config=False
    )


def watch_pods(kubeconfig: Path, until: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Official-client watch events of default's pods, up to the first of type `until`."""
    with official_client(kubeconfig) as api:
        watch = kubernetes.watch.Watch()
        stream = watch.stream(
            kubernetes.client.CoreV1Api(api).list_namespaced_pod,
            "default",
            _request_timeout=REQUEST_TIMEOUT,
            **kwargs,
        )
        for event in stream:
            yield event
            if event["type"] == until:
                watch.stop()


# --- the official kubernetes client ----------------------------------------------------------


async def test_official_client_lists_pods_by_label_selector(
    sim: ApiServerSim, kubeconfig: Path
) -> None:
    sim.apply_pod(make_pod("engine-0", labels={"app": "vllm"}, ip="10.0.0.5"))
    sim.apply_pod(make_pod("other", labels={"app": "redis"}))

    def list_pods() -> Any:
        with official_client(kubeconfig) as api:
            return kubernetes.client.CoreV1Api(api).list_namespaced_pod(
                "default", label_selector="app=vllm", _request_timeout=REQUEST_TIMEOUT
            )

    pods = await asyncio.to_thread(list_pods)
    [pod] = pods.items
    assert pod.metadata.name == "engine-0" and pod.status.pod_ip == "10.0.0.5"
    assert {(c.type, c.status) for c in pod.status.conditions} >= {("Ready", "True")}
    assert pods.metadata.resource_version == str(sim.resource_version)


async def test_official_watch_resumes_from_a_version_and_follows_bookmarks(
    sim: ApiServerSim, kubeconfig: Path
) -> None:
    sim.apply_pod(make_pod("early"))
    version = str(sim.resource_version)
    sim.apply_pod(make_pod("late"))

    def watch() -> list[tuple[str, str | None]]:
        events = watch_pods(
            kubeconfig,
            until="BOOKMARK",
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=5,
        )
        return [(e["type"], e["raw_object"]["metadata"].get("name")) for e in events]

    assert await asyncio.to_thread(watch) == [("ADDED", "late"), ("BOOKMARK", None)]


async def test_official_watch_sees_live_events(sim: ApiServerSim, kubeconfig: Path) -> None:
    def watch() -> list[Any]:
        events = watch_pods(kubeconfig, until="ADDED", timeout_seconds=5)
        return [e["object"] for e in events]

    watching = asyncio.ensure_future(asyncio.to_thread(watch))
    await wait_until(lambda: sim.open_watches == 1, what="the client's watch")
    sim.apply_pod(make_pod("newcomer", ip="10.0.0.9"))
    [pod] = await asyncio.wait_for(watching, REQUEST_TIMEOUT)
    assert pod.metadata.name == "newcomer" and pod.status.pod_ip == "10.0.0.9"


async def test_official_watch_raises_410_on_an_expired_version(
    sim: ApiServerSim, kubeconfig: Path
) -> None:
    sim.apply_pod(make_pod("a"))
    expired = str(sim.resource_version)
    sim.apply_pod(make_pod("b"))
    sim.compact()

    def watch() -> ApiException:
        with pytest.raises(ApiException) as error:
            list(watch_pods(kubeconfig, until="", resource_version=expired, timeout_seconds=5))
        return error.value

    error = await asyncio.to_thread(watch)
    assert error.status == 410
    assert error.reason.startswith("Expired: too old resource version")


async def test_official_client_lists_endpointslices(sim: ApiServerSim, kubeconfig: Path) -> None:
    endpoints = [("10.0.0.1", True), ("10.0.0.2", False)]
    sim.apply_endpointslice(make_endpointslice("vllm", endpoints, 8000))

    def list_slices() -> Any:
        with official_client(kubeconfig) as api:
            return kubernetes.client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
                "default",
                label_selector="kubernetes.io/service-name=vllm",
                _request_timeout=REQUEST_TIMEOUT,
            )

    [endpoint_slice] = (await asyncio.to_thread(list_slices)).items
    assert [(e.addresses, e.conditions.ready) for e in endpoint_slice.endpoints] == [
        (["10.0.0.1"], True),
        (["10.0.0.2"], False),
    ]
    assert endpoint_slice.ports[0].port == 8000


async def test_official_client_reads_a_missing_pod_as_a_404_status(kubeconfig: Path) -> None:
    def read_missing() -> ApiException:
        with official_client(kubeconfig) as api, pytest.raises(ApiException) as error:
            kubernetes.client.CoreV1Api(api).read_namespaced_pod(
                "ghost", "default", _request_timeout=REQUEST_TIMEOUT
            )
        return error.value

    error = await asyncio.to_thread(read_missing)
    assert error.status == 404
    assert json.loads(error.body)["reason"] == "NotFound"


# --- kubernetes_asyncio, as headcount uses it ------------------------------------------------


@pytest.fixture
async def core_api(kubeconfig: Path) -> AsyncIterator[Any]:
    api = await kubernetes_asyncio.config.new_client_from_config(
        config_file=str(kubeconfig), persist_config=False
    )
    async with api:
        yield kubernetes_asyncio.client.CoreV1Api(api)


async def test_asyncio_client_lists_and_watches_raw_streams(
    sim: ApiServerSim, core_api: Any
) -> None:
    sim.apply_pod(make_pod("a", labels={"app": "vllm"}))
    response = await core_api.list_namespaced_pod(
        "default", label_selector="app=vllm", _preload_content=False, _request_timeout=5
    )
    listed = await response.json()
    assert [p["metadata"]["name"] for p in listed["items"]] == ["a"]
    stream = await core_api.list_namespaced_pod(
        "default",
        label_selector="app=vllm",
        watch=True,
        resource_version=listed["metadata"]["resourceVersion"],
        allow_watch_bookmarks=True,
        timeout_seconds=5,
        _preload_content=False,
        _request_timeout=REQUEST_TIMEOUT,
    )
    async with stream:
        sim.apply_pod(make_pod("b", labels={"app": "vllm"}))
        added = json.loads(await asyncio.wait_for(stream.content.readline(), 5))
        bookmark = json.loads(await asyncio.wait_for(stream.content.readline(), 5))
    assert added["type"] == "ADDED" and added["object"]["metadata"]["name"] == "b"
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["resourceVersion"] == str(sim.resource_version)


async def test_asyncio_watch_deserializes_events(sim: ApiServerSim, core_api: Any) -> None:
    sim.apply_pod(make_pod("a", ip="10.0.0.7"))
    watch = kubernetes_asyncio.watch.Watch()
    async with watch.stream(
        core_api.list_namespaced_pod, "default", timeout_seconds=5, _request_timeout=10
    ) as events:
        event = await asyncio.wait_for(events.__anext__(), 5)
    assert event["type"] == "ADDED" and event["object"].status.pod_ip == "10.0.0.7"


# --- kubectl ---------------------------------------------------------------------------------

needs_kubectl = pytest.mark.skipif(
    not KUBECTL, reason="HEADCOUNT_KUBECTL is unset: `make pytest` extracts Debian's kubectl"
)


def kubectl_command(kubeconfig: Path, *args: str) -> list[str]:
    cache = kubeconfig.parent / "kubectl-cache"
    return [
        KUBECTL,
        f"--kubeconfig={kubeconfig}",
        f"--cache-dir={cache}",
        "--request-timeout=5s",
        *args,
    ]


async def kubectl(kubeconfig: Path, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        *kubectl_command(kubeconfig, *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(kubeconfig.parent)},
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    return out.decode()


@needs_kubectl
async def test_kubectl_gets_pods_by_label(sim: ApiServerSim, kubeconfig: Path) -> None:
    sim.apply_pod(make_pod("engine-0", labels={"app": "x"}))
    sim.apply_pod(make_pod("engine-1", labels={"app": "x"}, ready=False))
    sim.apply_pod(make_pod("cache", labels={"app": "y"}))
    lines = (await kubectl(kubeconfig, "get", "pods", "-l", "app=x")).splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["engine-0", "1/1", "Running"],
        ["engine-1", "0/1", "Running"],
    ]


@needs_kubectl
async def test_kubectl_watch_prints_new_pods(sim: ApiServerSim, kubeconfig: Path) -> None:
    sim.apply_pod(make_pod("existing"))
    process = await asyncio.create_subprocess_exec(
        *kubectl_command(kubeconfig, "get", "pods", "-w"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "HOME": str(kubeconfig.parent)},
    )
    assert process.stdout is not None
    try:
        await read_until(process.stdout, "existing")
        await wait_until(lambda: sim.open_watches == 1, timeout=10, what="kubectl's watch")
        sim.apply_pod(make_pod("newcomer"))
        assert (await read_until(process.stdout, "newcomer")).split()[:3] == [
            "newcomer",
            "1/1",
            "Running",
        ]
    finally:
        process.kill()
        await process.wait()


async def read_until(stdout: asyncio.StreamReader, word: str, timeout: float = 10) -> str:
    """The first output line that starts with `word`."""
    async with asyncio.timeout(timeout):
        while line := (await stdout.readline()).decode():
            if line.startswith(word):
                return line
    raise AssertionError(f"output ended before a line starting with {word!r}")


@needs_kubectl
async def test_kubectl_gets_endpointslices_as_json(sim: ApiServerSim, kubeconfig: Path) -> None:
    sim.apply_endpointslice(make_endpointslice("vllm", [("10.0.0.1", True)], 8000))
    listed = json.loads(await kubectl(kubeconfig, "get", "endpointslices", "-o", "json"))
    [endpoint_slice] = listed["items"]
    assert endpoint_slice["kind"] == "EndpointSlice"
    assert endpoint_slice["metadata"]["name"] == "vllm-slice"
    assert endpoint_slice["endpoints"][0]["addresses"] == ["10.0.0.1"]


POD_MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: engine-0
  labels: {app: vllm}
spec:
  containers:
  - name: engine
    image: vllm/vllm-openai:latest
"""


@needs_kubectl
async def test_kubectl_apply_validates_against_the_served_openapi_document(
    sim: ApiServerSim, kubeconfig: Path
) -> None:
    manifest = kubeconfig.parent / "pod.yaml"
    manifest.write_text(POD_MANIFEST)
    assert (await kubectl(kubeconfig, "apply", "-f", str(manifest))).strip() == (
        "pod/engine-0 created"
    )
    assert (await kubectl(kubeconfig, "apply", "-f", str(manifest))).strip() == (
        "pod/engine-0 unchanged"
    )
    assert [pod["metadata"]["labels"] for pod in sim.pods()] == [{"app": "vllm"}]


@needs_kubectl
async def test_kubectl_refuses_a_misspelled_field_from_the_openapi_document(
    sim: ApiServerSim, kubeconfig: Path
) -> None:
    manifest = kubeconfig.parent / "pod.yaml"
    manifest.write_text(POD_MANIFEST.replace("spec:", "sepc:"))
    refused = re.escape('unknown field "sepc" in io.k8s.api.core.v1.Pod')
    with pytest.raises(AssertionError, match=refused):
        await kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert sim.pods() == []


# --- InferencePools (inference.networking.k8s.io/v1, a custom resource) ------------------------

POOLS = ("inference.networking.k8s.io", "v1", "default", "inferencepools")


async def test_official_client_lists_gets_and_watches_inference_pools(
    sim: ApiServerSim, kubeconfig: Path
) -> None:
    sim.apply(make_inference_pool("llama", match_labels={"app": "llama"}, ports=(8000, 8001)))
    sim.apply(make_inference_pool("qwen", match_labels={"app": "qwen"}))

    def read() -> tuple[Any, Any, Any]:
        with official_client(kubeconfig) as api:
            custom = kubernetes.client.CustomObjectsApi(api)
            listed = custom.list_namespaced_custom_object(
                *POOLS, field_selector="metadata.name=llama", _request_timeout=REQUEST_TIMEOUT
            )
            got = custom.get_namespaced_custom_object(
                *POOLS[:3], "inferencepools", "qwen", _request_timeout=REQUEST_TIMEOUT
            )
            watch = kubernetes.watch.Watch()
            events = []
            for event in watch.stream(
                custom.list_namespaced_custom_object,
                *POOLS,
                resource_version=listed["metadata"]["resourceVersion"],
                allow_watch_bookmarks=True,
                timeout_seconds=5,
                _request_timeout=REQUEST_TIMEOUT,
            ):
                events.append((event["type"], event["object"]["metadata"].get("name")))
                if event["type"] == "BOOKMARK":
                    watch.stop()
            return listed, got, events

    reading = asyncio.ensure_future(asyncio.to_thread(read))
    await wait_until(lambda: sim.open_watches == 1, what="the client's watch")
    sim.patch("InferencePool", "default", "llama", {"spec": {"targetPorts": [{"number": 9000}]}})
    listed, got, events = await asyncio.wait_for(reading, REQUEST_TIMEOUT)
    assert listed["kind"] == "InferencePoolList"
    assert [pool["metadata"]["name"] for pool in listed["items"]] == ["llama"]
    assert listed["items"][0]["spec"]["targetPorts"] == [{"number": 8000}, {"number": 8001}]
    assert (got["apiVersion"], got["kind"]) == ("inference.networking.k8s.io/v1", "InferencePool")
    assert got["spec"]["selector"] == {"matchLabels": {"app": "qwen"}}
    assert events == [("MODIFIED", "llama"), ("BOOKMARK", None)]


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ({"targetPorts": [{"number": 8000}]}, "spec.selector.matchLabels: Required value"),
        ({"selector": {"matchLabels": {"app": "x"}}, "targetPorts": []}, "1 to 8 ports"),
        (
            {"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [{"number": 70000}]},
            "number 70000 is not a port",
        ),
        (
            {
                "selector": {"matchLabels": {"app": "x"}},
                "targetPorts": [{"number": n} for n in range(8000, 8009)],
            },
            "1 to 8 ports",
        ),
    ],
)
async def test_an_invalid_inference_pool_is_refused_with_422_as_the_crd_refuses_it(
    kubeconfig: Path, spec: dict[str, Any], refused: str
) -> None:
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "bad"},
        "spec": spec,
    }

    def create() -> ApiException:
        with official_client(kubeconfig) as api:
            custom = kubernetes.client.CustomObjectsApi(api)
            with pytest.raises(ApiException) as raised:
                custom.create_namespaced_custom_object(
                    *POOLS, pool, _request_timeout=REQUEST_TIMEOUT
                )
            return raised.value

    error = await asyncio.to_thread(create)
    assert error.status == 422
    status = json.loads(error.body)
    assert status["reason"] == "Invalid"
    assert status["message"].startswith(
        'InferencePool.inference.networking.k8s.io "bad" is invalid: '
    )
    assert refused in status["message"]


POOL_MANIFEST = """\
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: vllm-llama
spec:
  selector:
    matchLabels: {app: vllm-llama}
  targetPorts:
  - number: 8000
  endpointPickerRef:
    name: headcount
    port: {number: 9002}
"""


@needs_kubectl
async def test_kubectl_applies_and_gets_inference_pools(
    sim: ApiServerSim, kubeconfig: Path
) -> None:
    manifest = kubeconfig.parent / "pool.yaml"
    manifest.write_text(POOL_MANIFEST)
    created = "inferencepool.inference.networking.k8s.io/vllm-llama created"
    assert (await kubectl(kubeconfig, "apply", "-f", str(manifest))).strip() == created
    manifest.write_text(POOL_MANIFEST.replace("number: 8000", "number: 8001"))
    configured = "inferencepool.inference.networking.k8s.io/vllm-llama configured"
    assert (await kubectl(kubeconfig, "apply", "-f", str(manifest))).strip() == configured
    lines = (await kubectl(kubeconfig, "get", "inferencepools")).splitlines()
    assert [line.split()[0] for line in lines] == ["NAME", "vllm-llama"]
    assert lines[0].split() == ["NAME", "AGE"]
    assert (await kubectl(kubeconfig, "get", "infpool", "-o", "name")).strip() == (
        "inferencepool.inference.networking.k8s.io/vllm-llama"
    )
    shown = yaml.safe_load(
        await kubectl(kubeconfig, "get", "inferencepool", "vllm-llama", "-o", "yaml")
    )
    assert shown["spec"]["targetPorts"] == [{"number": 8001}]
    assert shown["spec"]["selector"] == {"matchLabels": {"app": "vllm-llama"}}
    [stored] = sim.objects("InferencePool")
    assert stored["spec"]["endpointPickerRef"]["name"] == "headcount"
