"""One change to one object, as the history keeps it for watches to replay and transition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from headcount.sim.apiserver.objects import JsonObject
from headcount.sim.apiserver.resources import Resource

__all__ = ["Event", "EventType"]

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class Event:
    """One change, as the history keeps it: the state after, and the state before."""

    resource_version: int
    type: EventType
    resource: Resource
    obj: JsonObject
    old: JsonObject | None
