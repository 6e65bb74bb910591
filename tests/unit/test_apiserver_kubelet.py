"""The emulator's kubelet starts created pods, on a fake sleep; address ranges.

The admin port answering through every fault is tests/process/test_apiserver_kubelet.py.
"""

from __future__ import annotations

import pytest

from headcount.sim.apiserver.kubelet import POD_IP_ANNOTATION, Kubelet, address_range
from headcount.sim.apiserver.resources import PODS
from headcount.sim.apiserver.store import Store
from headcount.sim.apiserver.writes import apply_as
from tests.support import FakeClock, wait_until
from tests.support.apiserver import bare_pod


def pod_status(store: Store, name: str) -> dict[str, object]:
    pod = store.get(PODS, "default", name)
    assert pod is not None
    status: dict[str, object] = pod["status"]
    return status


def ready(status: dict[str, object]) -> bool:
    conditions = status.get("conditions")
    assert isinstance(conditions, list)
    return {"type": "Ready", "status": "True"}.items() <= next(
        c for c in conditions if c["type"] == "Ready"
    ).items()


@pytest.fixture
def kubelet_store() -> tuple[Store, FakeClock]:
    """A store and its kubelet, whose delays are recorded and end once the test opens the gate."""
    store = Store(history_size=100)
    clock = FakeClock(sleeps="stay", gated=True)
    kubelet = Kubelet(store, address_range("127.0.0.11-127.0.0.12"), 2.5, clock.sleep)
    store.observers.append(kubelet.observe)
    return store, clock


async def test_kubelet_starts_a_created_pod_after_its_delay(
    kubelet_store: tuple[Store, FakeClock],
) -> None:
    store, clock = kubelet_store
    apply_as(store, PODS, bare_pod("engine-0"))
    await wait_until(lambda: clock.slept == [2.5], timeout=5, what="the kubelet's delay")
    assert pod_status(store, "engine-0") == {"phase": "Pending"}
    clock.gate.set()
    await wait_until(lambda: "podIP" in pod_status(store, "engine-0"), timeout=5, what="start")
    status = pod_status(store, "engine-0")
    assert (status["phase"], status["podIP"], ready(status)) == ("Running", "127.0.0.11", True)


async def test_kubelet_hands_out_the_lowest_free_address_or_the_annotated_one(
    kubelet_store: tuple[Store, FakeClock],
) -> None:
    store, clock = kubelet_store
    clock.gate.set()
    for name in ("a", "b"):
        apply_as(store, PODS, bare_pod(name))
        await wait_until(lambda n=name: "podIP" in pod_status(store, n), timeout=5, what=name)
    apply_as(store, PODS, bare_pod("c"))
    apply_as(store, PODS, bare_pod("chosen", {POD_IP_ANNOTATION: "127.0.0.99"}))
    await wait_until(lambda: "podIP" in pod_status(store, "chosen"), timeout=5, what="chosen")
    assert [pod_status(store, n).get("podIP") for n in ("a", "b", "c", "chosen")] == [
        "127.0.0.11",
        "127.0.0.12",
        None,  # the range is used up: it stays Pending
        "127.0.0.99",
    ]
    store.delete(PODS, "default", "a", graceful=False)
    apply_as(store, PODS, bare_pod("d"))
    await wait_until(lambda: "podIP" in pod_status(store, "d"), timeout=5, what="reuse")
    assert pod_status(store, "d")["podIP"] == "127.0.0.11"


async def test_kubelet_leaves_a_pod_deleted_before_it_starts(
    kubelet_store: tuple[Store, FakeClock],
) -> None:
    store, clock = kubelet_store
    apply_as(store, PODS, bare_pod("gone"))
    await wait_until(lambda: clock.slept == [2.5], timeout=5, what="the kubelet's delay")
    store.delete(PODS, "default", "gone", graceful=False)
    version = store.resource_version
    clock.gate.set()
    apply_as(store, PODS, bare_pod("next"))  # started after "gone"'s turn has passed
    await wait_until(lambda: "podIP" in pod_status(store, "next"), timeout=5, what="next")
    assert store.get(PODS, "default", "gone") is None
    assert store.resource_version == version + 2, "only next's creation and start"


def test_address_ranges_are_inclusive_and_checked() -> None:
    assert address_range("127.0.0.11-127.0.0.13") == ("127.0.0.11", "127.0.0.12", "127.0.0.13")
    assert address_range("127.0.0.5") == ("127.0.0.5",)
    with pytest.raises(ValueError, match="below the first"):
        address_range("127.0.0.13-127.0.0.11")
