"""The Kubernetes API server emulator, driven over HTTP the way a client sees it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from headcount.sim.apiserver import (
    ApiServerSim,
    ApiServerSimConfig,
    StatusError,
    make_endpointslice,
    make_pod,
    make_service,
    running_apiserver,
)
from tests.support import wait_until
from tests.support.apiserver import refused

PODS = "/api/v1/namespaces/default/pods"
BOOKMARK_INTERVAL = 0.3
READ_TIMEOUT = 5.0


@pytest.fixture
async def sim() -> AsyncIterator[ApiServerSim]:
    config = ApiServerSimConfig(bookmark_interval=BOOKMARK_INTERVAL, history_size=20)
    async with running_apiserver(config) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def get_json(
    http: aiohttp.ClientSession, url: str, *, status: int = 200, **kwargs: Any
) -> Any:
    async with http.get(url, **kwargs) as response:
        assert response.status == status, await response.text()
        assert response.content_type == "application/json"
        return await response.json()


class Stream:
    """One watch response, read event by event with a deadline on each read."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self, timeout: float = READ_TIMEOUT) -> dict[str, Any]:
        line = await asyncio.wait_for(self.response.content.readline(), timeout)
        assert line, "the stream ended"
        event: dict[str, Any] = json.loads(line)
        return event

    async def next_change(self) -> dict[str, Any]:
        """The next event that is not a bookmark."""
        while (event := await self.next())["type"] == "BOOKMARK":
            pass
        return event

    async def end(self) -> None:
        """Wait for a clean end of the stream."""
        rest = await asyncio.wait_for(self.response.content.read(), READ_TIMEOUT)
        assert rest == b""


@contextlib.asynccontextmanager
async def watching(
    http: aiohttp.ClientSession, sim: ApiServerSim, query: str = "", path: str = PODS
) -> AsyncIterator[Stream]:
    """A watch open on the server, its headers received."""
    before = sim.open_watches
    async with http.get(f"{sim.url}{path}?watch=true&{query}") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json"
        await wait_until(lambda: sim.open_watches > before, what="the watch to register")
        yield Stream(response)


async def first_event(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url) as response:
        return await Stream(response).next()


def names(items: list[dict[str, Any]]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


# --- LIST ------------------------------------------------------------------------------------


def apply_labelled_pods(sim: ApiServerSim) -> None:
    sim.apply_pod(make_pod("a", labels={"app": "x", "tier": "web"}))
    sim.apply_pod(make_pod("b", labels={"app": "y", "tier": "db"}))
    sim.apply_pod(make_pod("c", labels={"app": "z"}))
    sim.apply_pod(make_pod("d"))
    sim.apply_pod(make_pod("e", labels={"app": "x", "version": "3"}))


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", ["a", "b", "c", "d", "e"]),
        ("app=x", ["a", "e"]),
        ("app==x", ["a", "e"]),
        ("app!=x", ["b", "c", "d"]),
        ("app in (x,y)", ["a", "b", "e"]),
        ("app notin (x)", ["b", "c", "d"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c", "d", "e"]),
        ("app=x,tier", ["a"]),
        (" app in ( x , z ) , !version ", ["a", "c"]),
        ("version>2", ["e"]),
    ],
)
async def test_list_filters_by_each_selector_operator(
    sim: ApiServerSim, http: aiohttp.ClientSession, selector: str, expected: list[str]
) -> None:
    apply_labelled_pods(sim)
    body = await get_json(http, f"{sim.url}{PODS}", params={"labelSelector": selector})
    assert names(body["items"]) == expected


async def test_list_is_a_typed_list_at_the_global_version_with_untyped_items(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    sim.apply_pod(make_pod("a"))
    sim.apply_service(make_service("svc"))
    body = await get_json(http, f"{sim.url}/api/v1/pods")
    assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
    assert body["metadata"] == {"resourceVersion": str(sim.resource_version)}
    [pod] = body["items"]
    assert "kind" not in pod and "apiVersion" not in pod
    assert pod["metadata"]["uid"] and pod["metadata"]["creationTimestamp"]
    assert pod["metadata"]["resourceVersion"] == str(sim.resource_version - 1)


async def test_lists_endpointslices_of_the_discovery_group(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    sim.apply_endpointslice(make_endpointslice("svc", [("10.0.0.1", True)], namespace="ml"))
    url = f"{sim.url}/apis/discovery.k8s.io/v1/namespaces/ml/endpointslices"
    body = await get_json(http, url)
    assert body["kind"] == "EndpointSliceList"
    assert body["apiVersion"] == "discovery.k8s.io/v1"
    assert body["items"][0]["endpoints"][0]["addresses"] == ["10.0.0.1"]
    assert (await get_json(http, f"{sim.url}/apis/discovery.k8s.io/v1/endpointslices"))["items"]
    assert not (
        await get_json(http, f"{sim.url}/apis/discovery.k8s.io/v1/namespaces/x/endpointslices")
    )["items"]


@pytest.mark.parametrize(
    "selector", ["app in (x", "a=b=c", "!", "app notin ()", "-bad=x", "a=b,", "app=x y", "a>b"]
)
async def test_invalid_label_selector_is_a_bad_request_status(
    sim: ApiServerSim, http: aiohttp.ClientSession, selector: str
) -> None:
    for watch in ("false", "true"):
        params = {"labelSelector": selector, "watch": watch}
        body = await get_json(http, f"{sim.url}{PODS}", params=params, status=400)
        assert body["kind"] == "Status" and body["reason"] == "BadRequest" and body["code"] == 400


async def test_field_selector_selects_by_name_and_rejects_unknown_fields(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    apply_labelled_pods(sim)
    body = await get_json(http, f"{sim.url}{PODS}", params={"fieldSelector": "metadata.name=b"})
    assert names(body["items"]) == ["b"]
    body = await get_json(http, f"{sim.url}{PODS}", params={"fieldSelector": "metadata.name!=b"})
    assert names(body["items"]) == ["a", "c", "d", "e"]
    params = {"fieldSelector": "spec.secret=1"}
    body = await get_json(http, f"{sim.url}{PODS}", params=params, status=400)
    assert "field label not supported" in body["message"]


async def test_exact_list_rebuilds_an_old_version_until_it_is_compacted(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    sim.apply_pod(make_pod("a"))
    version = sim.resource_version
    sim.apply_pod(make_pod("b"))
    sim.delete_pod("default", "a")
    params = {"resourceVersion": str(version), "resourceVersionMatch": "Exact"}
    body = await get_json(http, f"{sim.url}{PODS}", params=params)
    assert names(body["items"]) == ["a"]
    assert body["metadata"]["resourceVersion"] == str(version)
    sim.compact()
    body = await get_json(http, f"{sim.url}{PODS}", params=params, status=410)
    assert body["reason"] == "Expired"


# --- WATCH -----------------------------------------------------------------------------------


async def test_watch_from_a_version_replays_later_history_then_streams_live(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    sim.apply_pod(make_pod("before"))
    version = sim.resource_version
    sim.apply_pod(make_pod("after"))
    async with watching(http, sim, f"resourceVersion={version}") as stream:
        replayed = await stream.next()
        assert replayed["type"] == "ADDED" and replayed["object"]["metadata"]["name"] == "after"
        assert replayed["object"]["kind"] == "Pod" and replayed["object"]["apiVersion"] == "v1"
        sim.apply_pod(make_pod("after", labels={"new": "label"}))
        modified = await stream.next()
        assert modified["type"] == "MODIFIED"
        assert modified["object"]["metadata"]["resourceVersion"] == str(sim.resource_version)
        sim.delete_pod("default", "before")
        deleted = await stream.next()
        assert deleted["type"] == "DELETED" and deleted["object"]["metadata"]["name"] == "before"


async def test_watch_without_a_version_starts_with_the_current_objects(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    apply_labelled_pods(sim)
    async with watching(http, sim, "labelSelector=app%3Dx") as stream:
        first, second = await stream.next(), await stream.next()
        assert [first["type"], second["type"]] == ["ADDED", "ADDED"]
        assert {first["object"]["metadata"]["name"], second["object"]["metadata"]["name"]} == {
            "a",
            "e",
        }
        sim.apply_pod(make_pod("f", labels={"app": "x"}))
        assert (await stream.next())["object"]["metadata"]["name"] == "f"


async def test_objects_leaving_or_entering_the_selector_are_deleted_or_added(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    sim.apply_pod(make_pod("a", labels={"app": "x"}))
    version = sim.resource_version
    async with watching(http, sim, f"labelSelector=app%3Dx&resourceVersion={version}") as stream:
        sim.patch("Pod", "default", "a", {"metadata": {"labels": {"app": "y"}}})
        left = await stream.next()
        assert left["type"] == "DELETED"
        assert left["object"]["metadata"]["labels"] == {"app": "x"}  # the last state it matched
        assert left["object"]["metadata"]["resourceVersion"] == str(sim.resource_version)
        sim.apply_pod(make_pod("other", labels={"app": "y"}))  # never matches: not seen
        sim.patch("Pod", "default", "a", {"metadata": {"labels": {"app": "x"}}})
        entered = await stream.next()
        assert entered["type"] == "ADDED" and entered["object"]["metadata"]["name"] == "a"


async def test_watch_is_scoped_to_its_namespace_and_resource(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    version = sim.resource_version
    async with watching(http, sim, f"resourceVersion={version}") as stream:
        sim.apply_pod(make_pod("elsewhere", namespace="other"))
        sim.apply_service(make_service("svc"))
        sim.apply_pod(make_pod("here"))
        assert (await stream.next())["object"]["metadata"]["name"] == "here"


async def test_bookmarks_arrive_at_the_interval_with_the_current_version(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    sim.apply_pod(make_pod("a"))
    started = time.monotonic()  # before the stream opens: load can only delay a bookmark
    async with watching(http, sim, "allowWatchBookmarks=true&resourceVersion=1") as stream:
        assert (await stream.next())["type"] == "ADDED"
        sim.apply_service(make_service("svc"))  # another resource still moves the version
        bookmarks = [await stream.next(), await stream.next()]
        elapsed = time.monotonic() - started
    assert [b["type"] for b in bookmarks] == ["BOOKMARK", "BOOKMARK"]
    assert bookmarks[0]["object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(sim.resource_version)},
    }
    assert elapsed >= 2 * BOOKMARK_INTERVAL


async def test_no_bookmarks_unless_allowed(sim: ApiServerSim, http: aiohttp.ClientSession) -> None:
    async with watching(http, sim, "timeoutSeconds=1") as stream:
        await stream.end()  # three bookmark intervals passed without one


async def test_timeout_seconds_ends_the_stream_cleanly(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    started = time.monotonic()
    async with watching(http, sim, "timeoutSeconds=1&allowWatchBookmarks=1") as stream:
        body = await asyncio.wait_for(stream.response.content.read(), READ_TIMEOUT)
    assert time.monotonic() - started >= 0.95
    events = [json.loads(line) for line in body.splitlines()]
    assert events and all(event["type"] == "BOOKMARK" for event in events)
    await wait_until(lambda: sim.open_watches == 0, what="the watch to close")


async def test_watch_from_a_compacted_version_gets_an_expired_error_event(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    sim.apply_pod(make_pod("a"))
    old = sim.resource_version
    sim.apply_pod(make_pod("b"))
    sim.compact()
    async with http.get(f"{sim.url}{PODS}?watch=1&resourceVersion={old}") as response:
        assert response.status == 200
        stream = Stream(response)
        error = await stream.next()
        await stream.end()
    assert error == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {old} ({sim.resource_version})",
            "reason": "Expired",
            "code": 410,
        },
    }
    async with watching(http, sim, f"resourceVersion={sim.resource_version}") as stream:
        sim.apply_pod(make_pod("c"))
        assert (await stream.next())["type"] == "ADDED"


async def test_bounded_history_expires_versions_older_than_what_it_keeps(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    first = sim.resource_version
    for i in range(25):  # the fixture keeps 20 changes
        sim.apply_pod(make_pod(f"p{i}"))
    async with http.get(f"{sim.url}{PODS}?watch=1&resourceVersion={first}") as response:
        event = await Stream(response).next()
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    kept = sim.resource_version - 20
    async with watching(http, sim, f"resourceVersion={kept}") as stream:
        assert (await stream.next())["object"]["metadata"]["resourceVersion"] == str(kept + 1)


async def test_graceful_delete_marks_the_pod_then_deletes_its_last_state(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    sim.apply_pod(make_pod("a"))
    async with watching(http, sim, f"resourceVersion={sim.resource_version}") as stream:
        sim.delete_pod("default", "a", graceful=True)
        terminating = await stream.next()
        assert terminating["type"] == "MODIFIED"
        assert terminating["object"]["metadata"]["deletionTimestamp"]
        sim.delete_pod("default", "a", graceful=True)  # already terminating: no event
        sim.delete_pod("default", "a")
        deleted = await stream.next()
        assert deleted["type"] == "DELETED"
        assert deleted["object"]["metadata"]["deletionTimestamp"]
        assert deleted["object"]["metadata"]["resourceVersion"] == str(sim.resource_version)
    assert sim.pods() == []


async def test_open_watches_counts_streams_until_the_client_leaves(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    async with watching(http, sim):
        assert sim.open_watches == 1
    await wait_until(lambda: sim.open_watches == 0, what="the server to notice the client left")


# --- faults ----------------------------------------------------------------------------------


async def test_drop_watches_ends_streams_cleanly(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    async with watching(http, sim) as stream:
        await sim.drop_watches()
        await stream.end()
    assert sim.open_watches == 0


async def test_drop_watches_with_reset_sends_a_tcp_reset(sim: ApiServerSim) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
    writer.write(f"GET {PODS}?watch=1 HTTP/1.1\r\nHost: sim\r\n\r\n".encode())
    headers = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
    assert headers.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in headers
    await sim.drop_watches(reset=True)
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(), READ_TIMEOUT)
    writer.close()
    assert sim.open_watches == 0


async def test_refuse_closes_the_port_and_restore_reopens_the_same_one(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    port = sim.port
    async with watching(http, sim) as stream:
        await sim.refuse()
        with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)):
            await asyncio.wait_for(stream.response.content.read(), READ_TIMEOUT)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), READ_TIMEOUT)
    await sim.restore()
    assert sim.port == port
    assert (await get_json(http, f"{sim.url}/version"))["gitVersion"].startswith("v1.")


async def test_blackhole_accepts_connections_but_never_answers(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    async with watching(http, sim, "resourceVersion=1") as stream:
        await sim.blackhole()
        _, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", sim.port), READ_TIMEOUT
        )
        writer.close()
        with pytest.raises(TimeoutError):
            await http.get(f"{sim.url}/version", timeout=aiohttp.ClientTimeout(total=0.5))
        sim.apply_pod(make_pod("unseen-until-restore"))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(stream.response.content.readany(), 0.5)
        await sim.restore()
        assert (await stream.next())["object"]["metadata"]["name"] == "unseen-until-restore"
    await get_json(http, f"{sim.url}/version")


async def test_stall_silences_watches_but_lists_still_answer(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    async with watching(http, sim, "allowWatchBookmarks=true&resourceVersion=1") as stream:
        sim.stall()
        sim.apply_pod(make_pod("a"))
        with pytest.raises(TimeoutError):  # not an event, not a bookmark, not a byte
            await asyncio.wait_for(stream.response.content.readany(), 3 * BOOKMARK_INTERVAL)
        assert names((await get_json(http, f"{sim.url}{PODS}"))["items"]) == ["a"]
        new_watch = asyncio.ensure_future(first_event(http, f"{sim.url}{PODS}?watch=1"))
        await wait_until(lambda: sim.open_watches == 2, what="the second watch")
        done, _ = await asyncio.wait([new_watch], timeout=0.5)
        assert not done, "a new watch answered while stalled"
        await sim.restore()
        assert (await stream.next_change())["object"]["metadata"]["name"] == "a"
        assert (await asyncio.wait_for(new_watch, READ_TIMEOUT))["type"] == "ADDED"


# --- writes, errors, discovery, tables -------------------------------------------------------


async def test_rest_create_and_delete_behave_like_the_real_api(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    pod = make_pod("made", namespace="ml")
    del pod["metadata"]["namespace"]
    async with http.post(f"{sim.url}/api/v1/namespaces/ml/pods", json=pod) as response:
        assert response.status == 201
        created = await response.json()
    assert created["kind"] == "Pod" and created["metadata"]["namespace"] == "ml"
    async with http.post(f"{sim.url}/api/v1/namespaces/ml/pods", json=pod) as response:
        assert response.status == 409 and (await response.json())["reason"] == "AlreadyExists"
    async with http.post(f"{sim.url}/api/v1/namespaces/other/pods", json=created) as response:
        assert response.status == 400
    async with http.delete(f"{sim.url}/api/v1/namespaces/ml/pods/made") as response:
        assert response.status == 200
    async with http.delete(f"{sim.url}/api/v1/namespaces/ml/pods/made") as response:
        body = await response.json()
        assert response.status == 404 and body["reason"] == "NotFound"
        assert body["message"] == 'pods "made" not found'


async def test_replace_with_a_stale_version_conflicts(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    stale = sim.apply_pod(make_pod("a"))
    sim.apply_pod(make_pod("a", labels={"moved": "on"}))
    async with http.put(f"{sim.url}{PODS}/a", json=stale) as response:
        assert response.status == 409 and (await response.json())["reason"] == "Conflict"
    headers = {"Content-Type": "application/merge-patch+json"}
    patch = json.dumps({"metadata": {"labels": {"moved": None}}})
    async with http.patch(f"{sim.url}{PODS}/a", data=patch, headers=headers) as response:
        assert response.status == 200
        assert (await response.json())["metadata"]["labels"] == {}


async def test_applying_the_same_object_twice_changes_nothing(sim: ApiServerSim) -> None:
    first = sim.apply_pod(make_pod("a"))
    version = sim.resource_version
    again = sim.apply_pod(make_pod("a"))
    assert sim.resource_version == version
    assert again["metadata"]["uid"] == first["metadata"]["uid"]
    changed = sim.apply_pod(make_pod("a", ip="10.1.1.1"))
    assert changed["metadata"]["uid"] == first["metadata"]["uid"]
    assert changed["metadata"]["resourceVersion"] == str(version + 1)


async def test_python_api_refuses_bad_objects_with_statuses(sim: ApiServerSim) -> None:
    with pytest.raises(StatusError) as missing:
        sim.delete_pod("default", "nobody")
    assert missing.value.code == 404
    with pytest.raises(StatusError) as bad_labels:
        sim.apply_pod(make_pod("a", labels={"app": "not valid!"}))
    assert bad_labels.value.code == 422
    with pytest.raises(StatusError):
        sim.apply({"kind": "Deployment", "metadata": {"name": "x"}})


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/nope", None, 404),
        ("GET", "/api/v1/namespaces/default/secrets", None, 404),
        ("GET", "/api/v1/namespaces/default/pods/ghost", None, 404),
        ("PUT", "/api/v1/pods", b"{}", 405),
        ("POST", "/api/v1/namespaces/default/pods", b"{not json", 400),
        ("POST", "/api/v1/namespaces/default/pods", b"[1, 2]", 400),
        ("POST", "/api/v1/namespaces/default/pods", b'{"metadata": {"name": "UPPER"}}', 422),
        ("POST", "/api/v1/namespaces/default/pods", b'{"metadata": {"labels": 3}}', 422),
        ("POST", "/api/v1/namespaces/default/services", b'{"kind": "Pod"}', 400),
        ("GET", "/api/v1/pods?watch=maybe", None, 400),
        ("GET", "/api/v1/pods?resourceVersion=abc", None, 400),
        ("GET", "/api/v1/pods?watch=1&timeoutSeconds=-1", None, 400),
        ("PATCH", "/api/v1/namespaces/default/pods/ghost", b"{}", 415),
        ("POST", "/_sim/faults/refuse", b"{}", 400),
        ("POST", "/_sim/faults/meteor", b"{}", 404),
    ],
)
async def test_bad_requests_answer_status_objects(
    sim: ApiServerSim,
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: bytes | None,
    status: int,
) -> None:
    async with http.request(method, f"{sim.url}{path}", data=body) as response:
        assert response.status == status
        answer = await response.json()
    assert answer["kind"] == "Status" and answer["code"] == status and answer["message"]


async def test_discovery_documents_describe_the_served_resources(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    assert (await get_json(http, f"{sim.url}/version"))["gitVersion"] == "v1.30.0"
    assert (await get_json(http, f"{sim.url}/api"))["versions"] == ["v1"]
    core = await get_json(http, f"{sim.url}/api/v1")
    pods = next(r for r in core["resources"] if r["name"] == "pods")
    assert pods["kind"] == "Pod" and pods["namespaced"] and pods["shortNames"] == ["po"]
    assert {"get", "list", "watch"} <= set(pods["verbs"])
    groups = await get_json(http, f"{sim.url}/apis")
    assert [g["name"] for g in groups["groups"]] == [
        "discovery.k8s.io",
        "inference.networking.k8s.io",
    ]
    group = await get_json(http, f"{sim.url}/apis/discovery.k8s.io/v1")
    assert [r["kind"] for r in group["resources"]] == ["EndpointSlice"]
    inference = await get_json(http, f"{sim.url}/apis/inference.networking.k8s.io")
    assert inference["preferredVersion"] == {
        "groupVersion": "inference.networking.k8s.io/v1",
        "version": "v1",
    }
    pools = await get_json(http, f"{sim.url}/apis/inference.networking.k8s.io/v1")
    [pool] = pools["resources"]
    assert (pool["name"], pool["kind"], pool["namespaced"]) == (
        "inferencepools",
        "InferencePool",
        True,
    )
    assert pool["shortNames"] == ["infpool"]
    assert {"get", "list", "watch", "create", "update", "patch", "delete"} <= set(pool["verbs"])


async def test_table_output_for_kubectl(sim: ApiServerSim, http: aiohttp.ClientSession) -> None:
    sim.apply_pod(make_pod("a", ready=False))
    sim.delete_pod("default", "a", graceful=True)
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    table = await get_json(http, f"{sim.url}{PODS}", headers={"Accept": accept})
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert [c["name"] for c in table["columnDefinitions"]][:3] == ["Name", "Ready", "Status"]
    [row] = table["rows"]
    assert row["cells"][:3] == ["a", "0/1", "Terminating"]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == "a"


async def test_admin_api_edits_objects_and_injects_faults(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    async with http.put(f"{sim.url}/_sim/objects", json=make_service("svc")) as response:
        assert response.status == 200
    assert sim.get("Service", "default", "svc") is not None
    patch = {"metadata": {"annotations": {"lora-modified": "1"}}}
    sim.apply_pod(make_pod("a"))
    async with http.patch(f"{sim.url}/_sim/objects/pods/default/a", json=patch) as response:
        assert (await response.json())["metadata"]["annotations"] == {"lora-modified": "1"}
    async with http.delete(f"{sim.url}/_sim/objects/pods/default/a?graceful=true") as response:
        assert response.status == 200
    assert sim.pods()[0]["metadata"]["deletionTimestamp"]
    async with http.post(f"{sim.url}/_sim/faults/stall") as response:
        assert (await response.json())["stalled"] is True
    async with http.post(f"{sim.url}/_sim/faults/restore") as response:
        assert (await response.json())["stalled"] is False
    async with http.post(f"{sim.url}/_sim/faults/refuse", json={"seconds": 1}) as response:
        assert response.status == 200
    await wait_until(lambda: refused(sim.url), what="the refusal to begin")
    await wait_until(lambda: answers(http, sim.url), what="the port to come back")


async def answers(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(f"{url}/version", timeout=aiohttp.ClientTimeout(total=1)) as response:
        return response.status == 200


async def test_malformed_objects_still_list_watch_and_tabulate(
    sim: ApiServerSim, http: aiohttp.ClientSession
) -> None:
    sim.apply_pod({"kind": "Pod", "metadata": {"name": "odd"}, "spec": {"containers": 7}})
    sim.apply_pod({"metadata": {"name": "odder"}, "status": "broken"})
    slice_ = {"kind": "EndpointSlice", "metadata": {"name": "s"}, "endpoints": [{"addresses": 5}]}
    sim.apply(slice_)
    accept = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    table = await get_json(http, f"{sim.url}{PODS}", headers=accept)
    assert [row["cells"][:3] for row in table["rows"]] == [
        ["odd", "0/0", "Pending"],
        ["odder", "0/0", "Unknown"],
    ]
    url = f"{sim.url}/apis/discovery.k8s.io/v1/endpointslices"
    assert (await get_json(http, url, headers=accept))["rows"][0]["cells"][3] == "<unset>"
    async with watching(http, sim, "fieldSelector=status.phase%3DPending") as stream:
        assert (await stream.next())["object"]["metadata"]["name"] == "odd"


async def test_command_line_serves_until_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "headcount.sim.apiserver",
        "--kubeconfig-out",
        str(kubeconfig),
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 20)).decode()
        url = line.split()[2]
        assert json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == url
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            assert (await get_json(http, f"{url}/version"))["gitVersion"] == "v1.30.0"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
