"""The router's waiting line: priority bands, weighted fair shares, arrival order, removal."""

from __future__ import annotations

from collections import Counter

from headcount.flow.queue import FairQueue

__all__: list[str] = []


def _drain(queue: FairQueue[str], count: int | None = None) -> list[str]:
    popped: list[str] = []
    while count is None or len(popped) < count:
        item = queue.pop()
        if item is None:
            break
        popped.append(item)
    return popped


def test_higher_priority_band_first_whatever_the_arrival() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(3):
        queue.push(f"batch{n}", priority=0, tenant="batch", weight=1, flow="", cost=1)
    queue.push("chat", priority=10, tenant="chat", weight=1, flow="", cost=1)
    queue.push("shed", priority=-1, tenant="shed", weight=1, flow="", cost=1)
    assert _drain(queue) == ["chat", "batch0", "batch1", "batch2", "shed"]
    assert len(queue) == 0 and queue.pop() is None


def test_tenants_of_one_band_share_by_weight() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(100):
        queue.push(f"a{n}", priority=0, tenant="a", weight=1, flow="", cost=1)
        queue.push(f"b{n}", priority=0, tenant="b", weight=2, flow="", cost=1)
    first = Counter(item[0] for item in _drain(queue, 60))
    assert first == {"a": 20, "b": 40}


def test_shares_are_of_cost_not_of_requests() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(100):
        queue.push(f"big{n}", priority=0, tenant="big", weight=1, flow="", cost=300)
        queue.push(f"small{n}", priority=0, tenant="small", weight=1, flow="", cost=100)
    first = Counter(item.rstrip("0123456789") for item in _drain(queue, 40))
    assert first == {"big": 10, "small": 30}


def test_flows_of_one_tenant_share_equally_and_keep_their_order() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(6):
        queue.push(f"x{n}", priority=0, tenant="t", weight=1, flow="x", cost=1)
    for n in range(2):
        queue.push(f"y{n}", priority=0, tenant="t", weight=1, flow="y", cost=1)
    assert _drain(queue) == ["x0", "y0", "x1", "y1", "x2", "x3", "x4", "x5"]


def test_flows_split_their_tenants_share_not_the_band() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(50):
        for flow in ("f1", "f2", "f3", "f4"):
            queue.push(f"many-{flow}-{n}", priority=0, tenant="many", weight=1, flow=flow, cost=1)
        queue.push(f"one-{n}", priority=0, tenant="one", weight=1, flow="", cost=1)
    first = Counter(item.split("-")[0] for item in _drain(queue, 40))
    assert first == {"many": 20, "one": 20}


def test_an_idle_tenant_gets_its_share_at_once_and_no_credit_for_being_away() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(50):
        queue.push(f"a{n}", priority=0, tenant="a", weight=1, flow="", cost=1)
    assert len(_drain(queue, 30)) == 30  # a alone for a while
    for n in range(50):
        queue.push(f"b{n}", priority=0, tenant="b", weight=1, flow="", cost=1)
    first = Counter(item[0] for item in _drain(queue, 20))
    assert first == {"a": 10, "b": 10}


def test_removed_entries_are_skipped_and_counted_out_at_once() -> None:
    queue: FairQueue[str] = FairQueue()
    entries = [
        queue.push(f"i{n}", priority=n % 2, tenant="t", weight=1, flow="", cost=1) for n in range(6)
    ]
    queue.remove(entries[1])
    queue.remove(entries[2])
    queue.remove(entries[2])
    assert len(queue) == 4
    assert queue.depths() == {0: 2, 1: 2}
    assert _drain(queue) == ["i3", "i5", "i0", "i4"]


def test_a_band_full_of_removed_entries_is_rebuilt_in_order() -> None:
    queue: FairQueue[str] = FairQueue()
    keep = [queue.push("first", priority=0, tenant="a", weight=1, flow="", cost=1)]
    gone = [
        queue.push(f"gone{n}", priority=0, tenant="b", weight=1, flow="", cost=1)
        for n in range(200)
    ]
    keep.append(queue.push("second", priority=0, tenant="a", weight=1, flow="", cost=1))
    keep.append(queue.push("third", priority=0, tenant="c", weight=1, flow="", cost=1))
    for entry in gone:
        queue.remove(entry)
    band = queue._bands[0]
    assert band.held < 200  # rebuilt: the removed entries are not held any more
    queue.remove(keep[1])
    assert len(queue) == 2
    assert sorted(_drain(queue)) == ["first", "third"]
