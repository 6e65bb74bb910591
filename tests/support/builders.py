"""Engines, their specs and ready fleets, built in memory: one builder of each.

The defaults make the plainest engine: a static engine named and known by its
name, at `http://{name}`, serving the model `m`. A module whose engines are
all alike binds its keywords once (`functools.partial`); `id` and `url` are
templates filled with the engine's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from headcount.clock import Clock
from headcount.config import OutlierSettings, ProbeSettings
from headcount.fleet import Engine, EngineLoad, EngineSpec, EngineState, Fleet, ProbeResult
from tests.support.clock import FakeClock

__all__ = ["CARDS", "MODEL", "engine", "ready_fleet", "spec"]

MODEL = "m"
CARDS: tuple[Mapping[str, Any], ...] = ({"id": MODEL},)
"""What a probe of a ready engine finds by default: the one model `m`."""


def spec(
    name: str,
    *,
    id: str = "{name}",
    url: str = "http://{name}",
    source: str = "static",
    **fields: Any,
) -> EngineSpec:
    """What discovery knows of an engine named `name`; `fields`: the rest of `EngineSpec`."""
    return EngineSpec(
        id=id.format(name=name),
        name=name,
        url=url.format(name=name),
        source=source,
        **fields,
    )


def engine(
    name: str,
    *models: str,
    adapters: Sequence[str] = (),
    state: EngineState = EngineState.READY,
    url: str = "http://{name}",
    **load: Any,
) -> Engine:
    """An engine as a snapshot holds it: `spec(name)`, serving `models` (`m` if none) and
    `adapters` of the first of them, in `state`; `load`: its `EngineLoad` figures."""
    served = models or (MODEL,)
    cards = (
        *({"id": model} for model in served),
        *({"id": adapter, "parent": served[0]} for adapter in adapters),
    )
    return Engine(spec(name, url=url), EngineLoad(**load), state, cards)


def ready_fleet(
    *specs: EngineSpec,
    cards: Sequence[Mapping[str, Any]] = CARDS,
    unhealthy_after: int = ProbeSettings().unhealthy_after,
    outliers: OutlierSettings | None = None,
    clock: Clock | None = None,
) -> Fleet:
    """A fleet holding `specs`, listed by their sources, each probed once and found serving
    `cards`; on `clock`, a fresh `FakeClock` if none (it times outlier ejections)."""
    fleet = Fleet(
        unhealthy_after=unhealthy_after,
        outliers=outliers,
        clock=FakeClock() if clock is None else clock,
    )
    for source in dict.fromkeys(each.source for each in specs):
        fleet.reconcile(source, [each for each in specs if each.source == source])
    for each in specs:
        fleet.apply_probe(each.id, ProbeResult(ok=True, cards=tuple(cards)))
    return fleet
