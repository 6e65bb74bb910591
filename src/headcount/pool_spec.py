"""An `InferencePool`'s spec read and checked as its CRD checks it (discovery and emulator).

The Gateway API Inference Extension's pool (inference.networking.k8s.io/v1)
names its members with `spec.selector.matchLabels` (a LabelSelector reduced to
matchLabels, 1 to 64 of them) and the ports they serve on with
`spec.targetPorts` (1 to 8 `{number}`, each 1-65535, no two alike).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headcount.selectors import valid_label_key, valid_label_value

__all__ = ["MAX_MATCH_LABELS", "MAX_TARGET_PORTS", "PoolTarget", "pool_target"]

MAX_TARGET_PORTS = 8
"""The CRD's bound on `spec.targetPorts`."""
MAX_MATCH_LABELS = 64
"""The CRD's bound on `spec.selector.matchLabels`."""


@dataclass(frozen=True, slots=True)
class PoolTarget:
    """What a pool says about its members: the labels a pod must carry, the ports it serves."""

    match_labels: tuple[tuple[str, str], ...]
    ports: tuple[int, ...]

    def selects(self, labels: Mapping[str, Any]) -> bool:
        return all(labels.get(key) == value for key, value in self.match_labels)

    @property
    def selector(self) -> str:
        """The selector as kubectl -l writes it (`app=vllm,model=llama`)."""
        return ",".join(f"{key}={value}" for key, value in self.match_labels)


def pool_target(pool: Mapping[str, Any]) -> PoolTarget:
    """The selector and ports of an `InferencePool`; raises ValueError for one the CRD would
    refuse (no matchLabels, no port or more than 8, a port outside 1-65535, twice the same)."""
    spec = pool.get("spec")
    selector = spec.get("selector") if isinstance(spec, Mapping) else None
    labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    if not isinstance(labels, Mapping) or not labels:
        raise ValueError("spec.selector.matchLabels: Required value")
    if len(labels) > MAX_MATCH_LABELS:
        raise ValueError(f"spec.selector.matchLabels: more than {MAX_MATCH_LABELS} labels")
    for key, value in labels.items():
        if not (isinstance(key, str) and isinstance(value, str)) or not (
            valid_label_key(key) and valid_label_value(value)
        ):
            raise ValueError(f"spec.selector.matchLabels: Invalid value: {key}={value}")
    targets = spec.get("targetPorts") if isinstance(spec, Mapping) else None
    if not isinstance(targets, list) or not 1 <= len(targets) <= MAX_TARGET_PORTS:
        raise ValueError(f"spec.targetPorts: must hold 1 to {MAX_TARGET_PORTS} ports")
    ports = tuple(_port_number(target) for target in targets)
    if len(set(ports)) != len(ports):
        raise ValueError("spec.targetPorts: port number must be unique")
    return PoolTarget(tuple(sorted(labels.items())), ports)


def _port_number(target: Any) -> int:
    number = target.get("number") if isinstance(target, Mapping) else None
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
        raise ValueError(f"spec.targetPorts: number {number!r} is not a port (1-65535)")
    return number
