"""Tenants: who a key belongs to, and what that tenant may have of the fleet.

The tenants file (`--tenants-file`, TOML) names tenants, their keys, their
priority, fair-share weight and limits; `[default]` sets the limits of the
`default` tenant (every request without a tenant key), `[objective.NAME]`
objectives that may lower a request's priority.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_TENANT", "Tenant", "Tenants"]

DEFAULT_TENANT = "default"


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's place in the queue and its limits (0: unlimited)."""

    name: str
    priority: int = 0
    """Higher is served first; below 0 is sheddable (refused when the fleet is saturated)."""
    weight: float = 1.0
    """Fair share among the tenants of one priority."""
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    """Prompt plus completion tokens."""
    max_concurrency: int = 0
    """Requests in flight, queued or at an engine."""

    @property
    def rate_limited(self) -> bool:
        return self.requests_per_minute > 0 or self.tokens_per_minute > 0


@dataclass(frozen=True, slots=True)
class Tenants:
    """A tenants file as the router holds it: keys as SHA-256 digests, never in clear."""

    by_digest: Mapping[bytes, Tenant] = field(default_factory=dict)
    """A key's SHA-256 digest → its tenant."""
    default: Tenant = field(default_factory=lambda: Tenant(DEFAULT_TENANT))
    objectives: Mapping[str, int] = field(default_factory=dict)
    """`x-gateway-inference-objective` name → the priority it asks for (never above the
    tenant's)."""

    @property
    def names(self) -> frozenset[str]:
        """Every tenant's name, `default` included: the metrics' label values."""
        return frozenset({self.default.name, *(t.name for t in self.by_digest.values())})
